"""The run's MCP endpoint through the stdio bridge, as a harness reaches it: a real Unix
socket, the bridge as a child process, a tool server on real Redis, the run's credential."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from worker.observe.masking import Masker
from worker.store import credentials
from worker.store.keys import Keys, SyncRedis
from worker.tools import bridge, calls
from worker.tools.endpoint import RunEndpoint, RunTools, ToolLimits
from worker.tools.schema import tool_set

pytestmark = pytest.mark.redis

BRIDGE = Path(bridge.__file__)


def lookup(order_id: int) -> dict[str, Any]:
    """Look up an order."""
    return {"id": order_id, "status": "shipped"}


def fail(why: str) -> str:
    raise ValueError(f"refused: {why}")


def big(size: int) -> str:
    return "x" * size


def hang(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


@dataclass
class Fixture:
    client: SyncRedis
    keys: Keys
    run_id: str
    token: str
    root: Path
    stop: threading.Event = field(default_factory=threading.Event)
    endpoints: list[RunEndpoint] = field(default_factory=list)

    def endpoint(
        self, *, run_id: str | None = None, limits: ToolLimits | None = None, secret: str = ""
    ) -> RunEndpoint:
        run = run_id or self.run_id
        tools = RunTools(
            run_id=run,
            turn=1,
            socket_path=self.root / run / ".home" / ".harness" / "mcp.sock",
            servers={"orders": calls.RedisToolSet(self.client, self.keys, run, "orders")},
            verify=lambda token: credentials.verify(self.client, self.keys, run, token),
            masker=Masker({"GRANTED": secret} if secret else {}),
            limits=limits or ToolLimits(timeout_s=3.0),
        )
        made = RunEndpoint(tools)
        made.open()
        self.endpoints.append(made)
        return made


@pytest.fixture
def fx(redis_url: str, tmp_path: Path) -> Iterator[Fixture]:
    client = cast(SyncRedis, redis.Redis.from_url(redis_url, decode_responses=True))
    keys = Keys(f"test-ep-{uuid.uuid4().hex[:8]}")
    run_id = "r" + uuid.uuid4().hex[:12]
    token = credentials.issue(client, keys, run_id, 60)
    # A long root: the socket's path passes the 107 bytes a socket address holds.
    root = tmp_path / ("deep" * 20)
    made = Fixture(client, keys, run_id, token, root)
    server = calls.ToolServer(client, keys, "orders", tool_set([lookup, fail, big, hang]))
    thread = threading.Thread(target=server.serve, args=(made.stop,), kwargs={"block_s": 0.2})
    thread.start()
    yield made
    made.stop.set()
    for endpoint in made.endpoints:
        endpoint.close()
    thread.join(5)
    for key in cast(redis.Redis, client).scan_iter(f"{keys.prefix}:*"):
        client.delete(key)
    client.close()


class Harness:
    """The bridge, launched as a harness launches its stdio MCP server, and spoken to."""

    def __init__(self, socket_path: Path, token: str, server: str = "orders") -> None:
        env = {"PATH": os.environ["PATH"], "HARNESS_RUN_TOKEN": token}
        self.proc = subprocess.Popen(
            [sys.executable, str(BRIDGE), str(socket_path), server],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        self.next_id = 0

    def send(self, message: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read().decode() if self.proc.stderr else "closed"
        return cast(dict[str, Any], json.loads(line))

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        while True:
            answer = self.read()
            if answer.get("id") == self.next_id:
                return answer

    def initialize(self) -> dict[str, Any]:
        answer = self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": tool, "arguments": arguments})["result"]

    def close(self) -> tuple[int, str]:
        if self.proc.stdin:
            # The bridge may be gone already: it exits once its endpoint closes the socket.
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        code = self.proc.wait(10)
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        return code, err


def text(result: dict[str, Any]) -> str:
    return "".join(c["text"] for c in result["content"])


def test_a_harness_lists_and_calls_the_tools_and_each_call_is_an_event(fx: Fixture) -> None:
    endpoint = fx.endpoint()
    harness = Harness(endpoint.tools.socket_path, fx.token)
    init = harness.initialize()
    assert init["result"]["capabilities"]["tools"] is not None
    listed = harness.request("tools/list")["result"]["tools"]
    assert {t["name"] for t in listed} == {"lookup", "fail", "big", "hang"}
    assert next(t for t in listed if t["name"] == "lookup")["description"] == "Look up an order."
    result = harness.call("lookup", order_id=7)
    assert not result.get("isError") and json.loads(text(result)) == {"id": 7, "status": "shipped"}
    raised = harness.call("fail", why="no")
    assert raised["isError"] and text(raised) == "ValueError: refused: no"
    assert harness.close()[0] == 0
    events = endpoint.drain()
    assert [e.type for e in events] == ["tool-call", "tool-result"] * 2
    call, done = events[0], events[1]
    assert call.model_dump() == {  # type: ignore[union-attr]
        "type": "tool-call", "call_id": "t1-1", "server": "orders", "tool": "lookup",
        "input": '{"order_id": 7}', "input_chars": 15,
    }  # fmt: skip
    assert done.ok and done.call_id == "t1-1" and done.duration_ms >= 0  # type: ignore[union-attr]
    assert not events[3].ok and "refused: no" in events[3].output  # type: ignore[union-attr]


def test_a_wrong_token_another_runs_token_and_an_unattached_server_are_refused(fx: Fixture) -> None:
    endpoint = fx.endpoint()
    other_run = "r" + uuid.uuid4().hex[:12]
    other_token = credentials.issue(fx.client, fx.keys, other_run, 60)
    for token, server in (("wrong", "orders"), (other_token, "orders"), (fx.token, "tickets")):
        code, err = Harness(endpoint.tools.socket_path, token, server).close()
        assert code == 1 and "refused" in err
    endpoint.close()
    said = [e.description for e in endpoint.drain()]  # type: ignore[union-attr]
    assert said == [
        "the run's MCP endpoint refused a connection: the run's credential was refused",
        "the run's MCP endpoint refused a connection: the run's credential was refused",
        "the run's MCP endpoint refused a connection: server 'tickets' is not attached to this run",
        "MCP server orders was not loaded by the harness this turn: it never reached the run's endpoint",
    ]


def test_an_older_or_revoked_token_is_refused_on_every_call(fx: Fixture) -> None:
    endpoint = fx.endpoint()
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    assert not harness.call("lookup", order_id=1).get("isError")
    credentials.issue(fx.client, fx.keys, fx.run_id, 60)  # the next turn's: this one is older
    refused = harness.call("lookup", order_id=2)
    assert refused["isError"] and "credential was refused" in text(refused)
    credentials.revoke(fx.client, fx.keys, fx.run_id)  # end, teardown
    assert harness.call("lookup", order_id=3)["isError"]
    harness.close()
    assert Harness(endpoint.tools.socket_path, fx.token).close()[0] == 1


def test_a_call_unanswered_by_its_deadline_is_an_error_result_and_the_session_goes_on(
    fx: Fixture,
) -> None:
    endpoint = fx.endpoint(limits=ToolLimits(timeout_s=0.5))
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    started = time.monotonic()
    late = harness.call("hang", seconds=1)
    # The server took it (its handler sleeps 1 s): slow, not a call no server took.
    assert late["isError"] and re.fullmatch(
        r"server \S+ of tool set orders took the call at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "
        r"and did not answer within 0\.5s",
        text(late),
    )
    assert time.monotonic() - started < 0.9
    time.sleep(0.7)  # the one server is done with the late call
    assert not harness.call("lookup", order_id=5).get("isError")
    harness.close()


def test_oversized_results_are_cut_and_say_so(fx: Fixture) -> None:
    endpoint = fx.endpoint(limits=ToolLimits(timeout_s=5, result_max_chars=3000))
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    result = text(harness.call("big", size=50_000))
    assert result.startswith("x" * 3000) and result.endswith(
        "the result was 50000 characters; 3000 are shown]"
    )
    harness.close()
    done = endpoint.drain()[-1]
    assert len(done.output) == 2000 and done.output_chars == 50_000  # type: ignore[union-attr]


def test_malformed_json_rpc_is_answered_or_ignored_and_the_connection_lives(fx: Fixture) -> None:
    endpoint = fx.endpoint()
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    harness.send(b"this is not json\n")
    harness.send(b'{"jsonrpc": "2.0", "id": 99, "method": 12}\n')
    harness.send(b"[1, 2, 3]\n")
    assert not harness.call("lookup", order_id=9).get("isError")
    harness.close()


def test_a_flood_of_calls_is_bounded_by_the_calls_in_flight(fx: Fixture) -> None:
    endpoint = fx.endpoint(limits=ToolLimits(timeout_s=5, in_flight=2))
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    for n in range(20):
        harness.send(
            {
                "jsonrpc": "2.0",
                "id": 1000 + n,
                "method": "tools/call",
                "params": {"name": "hang", "arguments": {"seconds": 0.3}},
            }
        )
    answers = [harness.read() for _ in range(20)]
    refused = [a for a in answers if a["result"].get("isError")]
    assert len(refused) >= 17 and all("too many tool calls" in text(a["result"]) for a in refused)
    harness.close()


def test_granted_values_are_masked_in_the_events(fx: Fixture) -> None:
    endpoint = fx.endpoint(secret="s3cr3t-value")
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    harness.call("fail", why="s3cr3t-value")
    harness.close()
    published = json.dumps([e.data() for e in endpoint.drain()])
    assert "s3cr3t-value" not in published


def test_closing_answers_what_waits_and_removes_the_socket(fx: Fixture) -> None:
    endpoint = fx.endpoint(limits=ToolLimits(timeout_s=5))
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    harness.send(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "hang", "arguments": {"seconds": 3}},
        }
    )
    deadline = time.monotonic() + 3
    while not endpoint.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    assert endpoint.busy
    endpoint.close()
    assert not endpoint.tools.socket_path.exists()
    events = endpoint.drain()
    assert [e.type for e in events] == ["tool-call", "tool-result"]
    assert not events[1].ok and "turn ended" in events[1].output  # type: ignore[union-attr]
    harness.close()


def test_the_bridge_exits_cleanly_when_its_endpoint_goes_away(fx: Fixture) -> None:
    endpoint = fx.endpoint()
    harness = Harness(endpoint.tools.socket_path, fx.token)
    harness.initialize()
    endpoint.close()  # the turn is over: its endpoint stops
    assert harness.proc.wait(10) == 0
    assert harness.proc.stderr is not None
    assert "Fatal Python error" not in harness.proc.stderr.read().decode()
