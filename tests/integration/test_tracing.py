"""One OpenTelemetry trace from the producer's call to the harness: a real OTLP receiver of
ours on loopback, the SDK's own exporter in a real ``harness`` command and a real worker."""

from __future__ import annotations

import os
import subprocess
import sys
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
        spans = receiver.wait_for(lambda got: {"exec", "snapshot"} <= set(by_name(got)))
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
