"""Row 13: a tool call's round trip. A harness's call (the stdio bridge, as a CLI launches it)
through the run's MCP endpoint (its Unix socket, the SDK's server, the run's credential
checked) to a producer's handler served over Redis, and back; against the same handler, on
the same server, called over Redis directly (a durable call submitted and its reply awaited:
no endpoint, no bridge, no MCP). Alternating call by call in one run; every answer checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, cast

from bench.context import Bench
from bench.stats import p50, percentile
from bench.table import Figure, RowResult
from worker.observe.masking import Masker
from worker.store import credentials
from worker.store.keys import SyncRedis
from worker.tools import bridge, calls
from worker.tools.endpoint import RunEndpoint, RunTools, ToolLimits
from worker.tools.schema import tool_set

CALLS = {"full": 1000, "quick": 300, "smoke": 20}
WARMUP = 5
SET = "bench"


def echo(text: str) -> str:
    """Returns its text."""
    return text


class _Harness:
    """The bridge as a harness's MCP client speaks to it: one request, one answer."""

    def __init__(self, socket_path: str, token: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, bridge.__file__, socket_path, SET],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), "HARNESS_RUN_TOKEN": token},
        )
        self.next = 0
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b"}}
        self.request("initialize", hello)
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.next += 1
        self._send({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params})
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def call(self, text: str) -> str:
        result = self.request("tools/call", {"name": "echo", "arguments": {"text": text}})
        return "".join(c["text"] for c in result["result"]["content"])

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def run(bench: Bench) -> RowResult:
    n = CALLS.get(bench.profile, CALLS["full"])
    result = RowResult("13", f"tool call round trip ({n:,} calls each way)")
    client, keys = cast(SyncRedis, bench.redis), bench.env.keys
    run_id = "bench-" + uuid.uuid4().hex[:8]
    token = credentials.issue(client, keys, run_id, 3600)
    stop = threading.Event()
    server = calls.ToolServer(client, keys, SET, tool_set(echo))
    thread = threading.Thread(target=server.serve, args=(stop,), kwargs={"block_s": 0.5})
    thread.start()
    endpoint = RunEndpoint(
        RunTools(
            run_id=run_id,
            turn=1,
            socket_path=bench.tmp / "tools" / "mcp.sock",
            servers={SET: calls.RedisToolSet(client, keys, run_id, SET)},
            verify=lambda t: credentials.verify(client, keys, run_id, t),
            masker=Masker({}),
            limits=ToolLimits(timeout_s=30),
        )
    )
    endpoint.open()
    harness = _Harness(str(endpoint.tools.socket_path), token)
    via_endpoint: list[float] = []
    direct: list[float] = []
    right = True
    try:
        for i in range(-WARMUP, n):
            text = f"call-{i}"
            started = time.perf_counter()
            right &= harness.call(text) == text
            if i >= 0:
                via_endpoint.append(time.perf_counter() - started)
            started = time.perf_counter()
            call_id = f"d{i}"
            calls.ensure_group(client, keys, SET)
            calls.submit(
                client, keys, SET, run_id=run_id, call_id=call_id, tool="echo",
                arguments=json.dumps({"text": text}), deadline=time.time() + 30,
            )  # fmt: skip
            reply = calls.wait_reply(client, keys, run_id, call_id, time.time() + 30)
            right &= reply is not None and reply.output == text
            if i >= 0:
                direct.append(time.perf_counter() - started)
    finally:
        harness.close()
        endpoint.close()
        stop.set()
        thread.join(10)
        credentials.revoke(client, keys, run_id)
        client.delete(keys.tool_calls(SET), keys.tool_definitions(SET))
    events = endpoint.drain()
    result.checks["every call answered with its own text, both ways"] = right
    result.checks["every endpoint call published as tool-call and tool-result"] = len(
        events
    ) == 2 * (n + WARMUP)
    ms = 1000.0
    result.add(
        Figure(
            "tool call round trip p50: harness -> endpoint -> handler vs Redis directly",
            p50(via_endpoint) * ms,
            p50(direct) * ms,
            "ms",
        ),
        Figure(
            "tool call round trip p99: harness -> endpoint -> handler vs Redis directly",
            percentile(via_endpoint, 99) * ms,
            percentile(direct, 99) * ms,
            "ms",
        ),
    )
    result.notes.append(
        "the endpoint's share: the bridge's two socket hops, the SDK's JSON-RPC, the credential "
        "checked in Redis per call, two events queued for the turn's stream"
    )
    return result
