"""Tools for the agent through a real worker: the demo harness calls a tool set served by
``harness tools serve`` in other processes (local sandbox, real Redis). A deadline no server
meets, a server killed mid-call, two servers sharing, a raising handler; the run's endpoint
refusing a wrong token, another run's, an older one and one after ``end``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient
from worker.tools import bridge

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def tools_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("tools"), redis_url, HARNESS_TOOL_CALL_TIMEOUT_S="12")
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def tools_worker(tools_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(tools_env)
    yield worker
    worker.stop()


class Servers:
    """``harness tools serve`` processes of the deployment, stopped after the test."""

    def __init__(self, env: Env) -> None:
        self.env, self.procs = env, []  # type: ignore[var-annotated]

    def start(
        self, name: str = "orders", lease: float = 30.0, concurrency: int = 8
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "tools", "serve", name,
             "tests.integration.tool_handlers:HANDLERS", "--lease", str(lease),
             "--concurrency", str(concurrency)],
            cwd=ROOT, env={**os.environ, **self.env.vars}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        r = self.env.redis()
        while time.monotonic() < deadline and not r.exists(self.env.keys.tool_definitions(name)):
            time.sleep(0.05)  # a server has published its definitions: it serves
        time.sleep(0.3)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)


@pytest.fixture
def servers(tools_env: Env) -> Iterator[Servers]:
    made = Servers(tools_env)
    yield made
    made.stop()
    r = tools_env.redis()
    r.delete(tools_env.keys.tool_definitions("orders"), tools_env.keys.tool_calls("orders"))


def run(client: HarnessClient, script: str, **options: Any) -> str:
    return client.start_run("stdio-json", script, executable=DEMO, tools=["orders"], **options)


def texts(client: HarnessClient, run_id: str, turn: int = 1) -> list[str]:
    return [
        e.data["text"]
        for e in client.events(run_id)
        if e.turn == turn and e.type == "assistant-text"
    ]


def of(client: HarnessClient, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in client.events(run_id) if e.type == kind]


def test_a_raising_handler_returns_its_text_and_the_turn_goes_on(
    tools_env: Env, tools_worker: WorkerProcess, servers: Servers
) -> None:
    servers.start()
    client = tools_env.client()
    run_id = run(
        client, '@tool orders fail {"why": "no stock"}\n@tool orders lookup {"order_id": 3}'
    )
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    assert texts(client, run_id)[:2] == [
        "tool orders.fail error: ValueError: cannot: no stock",
        'tool orders.lookup ok: {"id":3,"status":"shipped"}',
    ]
    results = of(client, run_id, "tool-result")
    assert [r["ok"] for r in results] == [False, True]
    assert "Traceback" not in json.dumps(results)


def test_a_call_no_server_answers_by_its_deadline_is_an_error_and_the_turn_goes_on(
    tools_env: Env, tools_worker: WorkerProcess
) -> None:
    client = tools_env.client()
    run_id = run(client, '@tool orders lookup {"order_id": 1}\n@text still here')
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    [result] = of(client, run_id, "tool-result")
    assert (
        not result["ok"] and "no server of tool set orders answered within 12s" in result["output"]
    )
    assert result["duration_ms"] >= 11_000
    assert "still here" in texts(client, run_id)


def test_a_server_killed_mid_call_loses_nothing_another_takes_it(
    tools_env: Env, tools_worker: WorkerProcess, servers: Servers
) -> None:
    first = servers.start(lease=1.0)
    mark = tools_env.tmp / "slow-started"
    mark.unlink(missing_ok=True)
    client = tools_env.client()
    run_id = run(client, f'@tool orders slow {{"mark": "{mark}", "seconds": 2}}')
    deadline = time.monotonic() + 30
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.read_text() == str(first.pid)
    os.killpg(first.pid, signal.SIGKILL)  # dies holding the call
    second = servers.start(lease=1.0)
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    [result] = of(client, run_id, "tool-result")
    assert result["ok"] and result["output"] == f"slow done by {second.pid}"


def test_two_servers_share_a_sets_calls(
    tools_env: Env, tools_worker: WorkerProcess, servers: Servers
) -> None:
    # One call at a time each: the second call goes to the server that is free.
    pids = {servers.start(concurrency=1).pid, servers.start(concurrency=1).pid}
    client = tools_env.client()
    runs = [run(client, f'@tool orders which {{"tag": "r{n}", "seconds": 4}}') for n in range(2)]
    answered = set()
    for run_id in runs:
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
        [result] = of(client, run_id, "tool-result")
        answered.add(int(result["output"].rsplit(" ", 1)[1]))
    assert answered == pids


class Bridge:
    """The stdio bridge, as a harness would launch it, with a token of our choosing."""

    def __init__(self, socket_path: Path, token: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, bridge.__file__, str(socket_path), "orders"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={"PATH": os.environ["PATH"], "HARNESS_RUN_TOKEN": token},
        )  # fmt: skip
        self.next = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next += 1
        try:
            self.proc.stdin.write(
                json.dumps(
                    {"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}
                ).encode()
                + b"\n"
            )
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def open(self) -> bool:
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        return self.request("initialize", hello) is not None

    def lookup(self) -> dict[str, Any] | None:
        answer = self.request("tools/call", {"name": "lookup", "arguments": {"order_id": 1}})
        return None if answer is None else answer["result"]

    def close(self) -> str:
        if self.proc.stdin:
            # The bridge may be gone already: it exits once its endpoint closes the socket.
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.proc.wait(10)
        return self.proc.stderr.read().decode() if self.proc.stderr else ""


def token_of(workspace: Path, name: str = "env.txt") -> str:
    path = workspace / name
    deadline = time.monotonic() + 30
    while not (path.exists() and "HARNESS_RUN_TOKEN=" in path.read_text()):
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)
    return next(
        line.split("=", 1)[1]
        for line in path.read_text().splitlines()
        if line.startswith("HARNESS_RUN_TOKEN=")
    )


def test_the_endpoint_opens_only_to_its_runs_live_token(
    tools_env: Env, tools_worker: WorkerProcess, servers: Servers
) -> None:
    servers.start()
    client = tools_env.client()
    root = tools_env.tmp / "workspaces" / "local" / "run"
    other = run(client, "@run sh -c printenv>env.txt")
    assert client.wait(other, 1, timeout=60).type == "turn-complete"
    others_token = token_of(root / other)
    run_id = run(client, "@run sh -c printenv>env.txt")
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    older = token_of(root / run_id)
    client.submit_turn(run_id, "@run sh -c printenv>env2.txt\n@sleep 8")
    live = token_of(root / run_id, "env2.txt")
    socket_path = root / run_id / ".home" / ".harness-endpoint" / "mcp.sock"
    assert socket_path.exists()
    for refused in ("wrong", others_token, older):
        denied = Bridge(socket_path, refused)
        assert not denied.open() and "refused" in denied.close()
    own = Bridge(socket_path, live)
    assert own.open()
    answer = own.lookup()
    assert answer is not None and not answer.get("isError")
    client.end(run_id)
    after = own.lookup()  # the connection outlived the turn, or not: never a call again
    assert after is None or after.get("isError")
    own.close()
    late = Bridge(socket_path, live)
    assert not late.open()
    late.close()
    calls = of(client, run_id, "tool-call")
    assert [c["tool"] for c in calls][:1] == ["lookup"]


def wait_pending(client: HarnessClient, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = client.pending(run_id)
        if pending:
            return pending[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing asked in {run_id}")


@pytest.mark.parametrize("allow", [True, False])
def test_under_posture_ask_the_endpoint_asks_for_a_harness_that_does_not(
    tools_env: Env, tools_worker: WorkerProcess, servers: Servers, allow: bool
) -> None:
    """stdio-json's harness does not ask for MCP calls (capability mcp_ask false): the
    endpoint asks before it makes each one, as a permission request like any other."""
    servers.start()
    client = tools_env.client()
    run_id = run(client, '@tool orders lookup {"order_id": 2}', posture="ask")
    pending = wait_pending(client, run_id)
    assert pending["tool"] == "mcp__orders__lookup" and '"order_id": 2' in pending["input"]
    if allow:
        client.approve(run_id, pending["request_id"], by="tester")
    else:
        client.deny(run_id, pending["request_id"], message="not this one", by="tester")
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    [decision] = of(client, run_id, "permission-decision")
    assert decision["decision"] == ("allow" if allow else "deny") and decision["by"] == "tester"
    [result] = of(client, run_id, "tool-result")
    if allow:
        assert result["ok"] and result["output"] == '{"id":2,"status":"shipped"}'
    else:
        assert not result["ok"] and result["output"] == "not this one"
    types = [e.type for e in client.events(run_id)]
    assert (
        types.index("permission-request")
        < types.index("permission-decision")
        < types.index("tool-result")
    )
