"""One OpenTelemetry trace from the producer's call to the harness: a real OTLP receiver of
ours on loopback, the SDK's own exporter in a real ``harness`` command and a real worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from bench.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.conftest import ROOT
from tests.integration.conftest import DEMO, Env, start_worker

pytestmark = [pytest.mark.redis, pytest.mark.celery]

SCRIPT = "@env TRACEPARENT\n@usage 5 7\n@complete traced"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    served = OtlpReceiver()
    yield served
    served.close()


def otel_env(receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within the test's patience
        **extra,
    }


def harness_run(env: Env, otel: dict[str, str]) -> str:
    """``harness run`` (the producer) in a process of its own; the run id it printed."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "stdio-json", SCRIPT, "--executable", DEMO],
        cwd=ROOT,
        env={**variables, **env.vars, **otel},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


def child_of(span: ReceivedSpan, parent: ReceivedSpan) -> bool:
    return span.trace_id == parent.trace_id and span.parent_id == parent.span_id


def test_one_trace_goes_from_the_harness_command_through_celery_to_the_exec(
    env: Env, receiver: OtlpReceiver
) -> None:
    worker = start_worker(env, extra_env=otel_env(receiver))
    try:
        run_id = harness_run(env, otel_env(receiver))
        client = env.client()
        terminal = client.wait(run_id, 1, timeout=60)
        assert terminal.type == "turn-complete", terminal.data
        wanted = {"harness run", "invoke_agent stdio-json", "exec", "snapshot"}
        spans = receiver.wait_for(lambda got: wanted <= set(by_name(got)))
    finally:
        worker.stop()
    named = by_name(spans)
    command, start = named["harness run"], named["HarnessClient.start_run"]
    publish, consume = named["apply_async/harness.run_turn"], named["run/harness.run_turn"]
    turn, exec_ = named["invoke_agent stdio-json"], named["exec"]
    assert command.parent_id == "" and command.service == "harness"
    assert child_of(start, command) and start.attributes["harness.run.id"] == run_id
    assert child_of(publish, start) and publish.kind == "PRODUCER"
    assert child_of(consume, publish) and consume.kind == "CONSUMER"
    assert consume.service == "harness-worker"
    assert child_of(turn, consume) and turn.kind == "CLIENT"
    assert child_of(named["queue wait"], consume)
    for step in ("prepare sandbox", "exec", "snapshot", "park"):
        assert child_of(named[step], turn), step
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.name"] == "stdio-json"
    assert turn.attributes["gen_ai.usage.input_tokens"] == 5
    assert turn.attributes["gen_ai.usage.output_tokens"] == 7
    assert turn.attributes["gen_ai.response.model"] == "demo-1"
    record = client.status(run_id)
    assert turn.attributes["gen_ai.conversation.id"] == record["session_id"]
    assert turn.attributes["harness.outcome"] == "completed"
    # The harness saw the turn's span as its parent, and turn-started names the trace.
    events = list(client.events(run_id))
    started = events[0]
    assert started.type == "turn-started" and started.data["trace_id"] == turn.trace_id
    (seen,) = [e.data["text"] for e in events if e.type == "assistant-text"]
    version, trace_id, parent_id, flags = seen.removeprefix("TRACEPARENT=").split("-")
    assert (version, trace_id, parent_id) == ("00", turn.trace_id, turn.span_id)
    assert int(flags, 16) & 1, "sampled"
    assert exec_.start_ns >= turn.start_ns and exec_.end_ns <= turn.end_ns


def test_nothing_is_exported_and_nothing_carried_when_tracing_is_off(
    env: Env, receiver: OtlpReceiver
) -> None:
    off = otel_env(receiver, OTEL_SDK_DISABLED="true")
    worker = start_worker(env, extra_env=off)
    try:
        run_id = harness_run(env, off)
        client = env.client()
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    finally:
        worker.stop()
    events = list(client.events(run_id))
    assert "trace_id" not in events[0].data
    assert [e.data["text"] for e in events if e.type == "assistant-text"] == ["TRACEPARENT=<unset>"]
    assert receiver.requests == 0 and receiver.spans == []


PRODUCER = """\
import sys
from worker.client import HarnessClient

client = HarnessClient()
run_id = client.start_run(
    "stdio-json", sys.argv[1], executable=sys.argv[2], tools=("orders",)
)
print(run_id)
"""


def lookup(order_id: int) -> dict[str, object]:
    """Look up an order."""
    return {"id": order_id, "status": "shipped"}


def test_the_trace_goes_on_from_a_python_producer_to_the_agents_tool_call(
    env: Env, receiver: OtlpReceiver
) -> None:
    from worker.tools import calls
    from worker.tools.schema import tool_set

    stop = threading.Event()
    server = calls.ToolServer(env.redis(), env.keys, "orders", tool_set(lookup))
    serving = threading.Thread(target=server.serve, args=(stop,), kwargs={"block_s": 0.2})
    serving.start()
    worker = start_worker(env, extra_env=otel_env(receiver))
    try:
        variables = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        script = '@tool orders lookup {"order_id": 7}'
        done = subprocess.run(
            [sys.executable, "-c", PRODUCER, script, DEMO],
            cwd=ROOT,
            env={**variables, **env.vars, **otel_env(receiver)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.split()[0]
        terminal = env.client().wait(run_id, 1, timeout=60)
        assert terminal.type == "turn-complete", terminal.data
        wanted = {"execute_tool lookup", "invoke_agent stdio-json", "HarnessClient.start_run"}
        spans = receiver.wait_for(lambda got: wanted <= set(by_name(got)))
    finally:
        worker.stop()
        stop.set()
        serving.join(5)
    named = by_name(spans)
    start, tool = named["HarnessClient.start_run"], named["execute_tool lookup"]
    turn, exec_ = named["invoke_agent stdio-json"], named["exec"]
    assert start.parent_id == "" and start.service == "harness-client"
    assert {span.trace_id for span in spans} == {start.trace_id}
    # Its parent is the turn, or the MCP SDK's own span of the call (the SDK traces too).
    (parent,) = [s for s in spans if s.span_id == tool.parent_id]
    assert parent == turn or (parent.name == "tools/call lookup" and child_of(parent, turn))
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["harness.tool.server"] == "orders"
    assert tool.attributes["harness.tool.ok"] is True
    call = next(e for e in env.client().events(run_id) if e.type == "tool-call")
    assert tool.attributes["gen_ai.tool.call.id"] == call.data["call_id"]
    assert exec_.start_ns <= tool.start_ns <= tool.end_ns <= exec_.end_ns


def test_an_http_request_is_a_server_span_whose_parent_is_the_callers_traceparent(
    env: Env, receiver: OtlpReceiver
) -> None:
    from tests.integration.api_server import start_api

    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    worker = start_worker(env, extra_env=otel_env(receiver))
    api = start_api(env, **otel_env(receiver))
    try:
        api.add_tenant("acme")
        with api.client("acme") as http:
            made = http.post(
                "/v1/runs",
                json={"harness": "stdio-json", "input": "hi", "executable": DEMO},
                headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
            )
            assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
        assert env.client().wait(run_id, 1, timeout=60).type == "turn-complete"
        wanted = {"POST /v1/runs", "HarnessClient.start_run", "invoke_agent stdio-json"}
        spans = receiver.wait_for(lambda got: wanted <= set(by_name(got)))
    finally:
        api.stop()
        worker.stop()
    named = by_name(spans)
    request, start = named["POST /v1/runs"], named["HarnessClient.start_run"]
    assert (request.trace_id, request.parent_id) == (caller_trace, caller_span)
    assert request.kind == "SERVER" and request.service == "harness-api"
    assert request.attributes["http.response.status_code"] == 201
    assert request.span_id in ancestors(start, spans)
    assert named["invoke_agent stdio-json"].trace_id == caller_trace


def ancestors(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[str]:
    parents = {s.span_id: s.parent_id for s in spans}
    found, at = [], span.parent_id
    while at:
        found.append(at)
        at = parents.get(at, "")
    return found


def test_batched_spans_are_flushed_when_the_command_and_the_worker_exit(
    env: Env, receiver: OtlpReceiver
) -> None:
    # A batch delay no test outlives: whatever arrives was flushed by the process's exit.
    held = otel_env(receiver, OTEL_BSP_SCHEDULE_DELAY="600000")
    worker = start_worker(env, extra_env=held)
    try:
        run_id = harness_run(env, held)
        assert {s.name for s in receiver.spans} >= {"harness run", "HarnessClient.start_run"}
        assert env.client().wait(run_id, 1, timeout=60).type == "turn-complete"
        time.sleep(1)
        assert "invoke_agent stdio-json" not in {s.name for s in receiver.spans}
    finally:
        worker.stop()
    assert "invoke_agent stdio-json" in {s.name for s in receiver.spans}
    assert "turn.internal_error" not in worker.logs()
