"""A turn from producer to Redis stream through a real Celery worker (local sandbox)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from adapters.events import EVENT_TYPES
from tests.helpers import assert_one_terminal
from tests.integration.conftest import DEMO, Env, WorkerProcess
from worker.client import HarnessClient, StreamEvent
from worker.errors import InvalidInput, RunBusy, RunNotFound

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def run_turn(client: HarnessClient, text: str, **options: object) -> tuple[str, StreamEvent]:
    run_id = client.start_run("stdio-json", text, executable=DEMO, **options)
    return run_id, client.wait(run_id, 1, timeout=60)


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def assert_well_formed(events: list[StreamEvent]) -> None:
    """Contract types only, ids contiguous from seq 0, turn-started first, one terminal last."""
    assert events, "no events"
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.type in EVENT_TYPES for e in events)
    assert_one_terminal(events)


def test_turn_flows_from_producer_to_stream(shared_env: Env, shared_worker: WorkerProcess) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "hello worker")
    events = turn_events(client, run_id, 1)
    assert_well_formed(events)
    assert terminal.type == "turn-complete"
    assert terminal.data["text"] == "You said: hello worker"
    assert terminal.data["exit_code"] == 0
    assert [e.type for e in events] == [
        "turn-started",
        "session",
        "assistant-text",
        "sandbox-activity",
        "assistant-text",
        "usage",
        "workspace",
        "turn-complete",
    ]
    record = client.status(run_id)
    assert record["status"] == "idle"
    assert record["turns"] == 1
    assert record["model_reported"] == "demo-1"
    assert record["input_tokens"] == 14 and record["output_tokens"] == 9
    assert record["session_id"] == events[1].data["session_id"]


def test_second_turn_resumes_the_vendor_session(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id, _first = run_turn(client, "one")
    assert client.submit_turn(run_id, "two") == 2
    second = client.wait(run_id, 2, timeout=60)
    assert second.type == "turn-complete"
    assert "(turn 2 of this session)" in second.data["text"]
    session = next(e for e in turn_events(client, run_id, 2) if e.type == "session")
    assert session.data["resumed"] is True
    assert_well_formed(turn_events(client, run_id, 2))
    record = client.status(run_id)
    assert record["turns"] == 2 and record["resumed"] is True


def test_turn_while_one_is_in_flight_is_refused(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id = client.start_run("stdio-json", "@sleep 3", executable=DEMO)
    with pytest.raises(RunBusy):
        client.submit_turn(run_id, "too soon")
    client.cancel(run_id)
    client.wait(run_id, 1, timeout=30)


def test_cancel_ends_the_turn_within_two_seconds(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id = client.start_run("stdio-json", "@text working\n@sleep 60", executable=DEMO)
    for event in client.events(run_id, follow=True, timeout=30):
        if event.type == "assistant-text":
            break
    started = time.monotonic()
    assert client.cancel(run_id) is True
    terminal = client.wait(run_id, 1, timeout=10)
    assert time.monotonic() - started < 2.0
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "cancelled"
    assert terminal.data["retryable"] is False
    assert_well_formed(turn_events(client, run_id, 1))
    assert client.cancel(run_id) is False  # nothing in flight any more


def test_turn_timeout_ends_the_turn(shared_env: Env, shared_worker: WorkerProcess) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "@stream 100 0.1", timeout_s=1.5)
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "timeout"
    assert terminal.data["retryable"] is True
    assert_well_formed(turn_events(client, run_id, 1))


def test_one_mebibyte_input_reaches_the_harness(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    text = ("word " * 210_000)[: 1024 * 1024]
    run_id, terminal = run_turn(client, text)
    assert terminal.type == "turn-complete"
    started = turn_events(client, run_id, 1)[0]
    assert started.data["input_chars"] == len(text)
    assert terminal.data["text"].startswith("You said: word word")


def test_input_beginning_with_a_dash_is_input_not_an_option(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    _, terminal = run_turn(client, "--help -rf /")
    assert terminal.type == "turn-complete"
    assert terminal.data["text"] == "You said: --help -rf /"


def test_bad_output_is_counted_not_fatal(shared_env: Env, shared_worker: WorkerProcess) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "@garbage\n@bigline 20971520\n@text still here")
    assert terminal.type == "turn-complete"
    texts = [e.data["text"] for e in turn_events(client, run_id, 1) if e.type == "assistant-text"]
    assert "still here" in texts
    assert any("bad \ufffd\ufffd bytes" in t for t in texts)
    assert_well_formed(turn_events(client, run_id, 1))


def test_harness_exiting_without_terminal_gets_exit_error(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "@stderr something broke\n@exit 3")
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "exit"
    assert terminal.data["exit_code"] == 3
    assert "something broke" in terminal.data["stderr_tail"]
    assert_well_formed(turn_events(client, run_id, 1))


def test_second_terminal_line_is_dropped(shared_env: Env, shared_worker: WorkerProcess) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "@twice")
    assert terminal.data["text"] == "first"
    assert_well_formed(turn_events(client, run_id, 1))


def test_harness_error_line_is_a_session_error(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id, terminal = run_turn(client, "@error the model refused")
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "harness-error"
    assert terminal.data["error"] == "the model refused"
    assert client.status(run_id)["last_error"] == "harness-error: the model refused"


def test_end_tears_the_run_down_and_refuses_more_turns(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id, _ = run_turn(client, "hi")
    workspace = shared_env.tmp / "workspaces" / "local" / "run" / run_id
    assert workspace.exists()
    assert client.end(run_id)["status"] == "ended"
    assert not workspace.exists()
    assert client.end(run_id)["status"] == "ended"  # idempotent
    with pytest.raises(Exception, match="ended"):
        client.submit_turn(run_id, "more")


def test_refusals_create_nothing(shared_env: Env) -> None:
    client = shared_env.client()
    r = shared_env.redis()
    before = set(r.scan_iter(f"{shared_env.prefix}:*"))
    with pytest.raises(InvalidInput, match="unknown harness"):
        client.start_run("nope", "hi")
    with pytest.raises(InvalidInput, match="empty"):
        client.start_run("stdio-json", "   ", executable=DEMO)
    with pytest.raises(InvalidInput, match="stdio-json harness needs --executable"):
        client.start_run("stdio-json", "hi")
    with pytest.raises(RunNotFound):
        client.status("r" + "0" * 24)
    assert set(r.scan_iter(f"{shared_env.prefix}:*")) == before


def cli(
    env: Env, *args: str, stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **env.vars},
    )


def test_cli_run_follow_turn_status_and_exit_codes(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    done = cli(shared_env, "run", "stdio-json", "hello cli", "--executable", DEMO, "--follow")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    run_id = lines[0]
    assert run_id.startswith("r") and len(run_id) == 25
    assert "You said: hello cli" in done.stdout.decode()
    failed = cli(shared_env, "turn", run_id, "-", "--follow", "--json", stdin=b"@error nope")
    assert failed.returncode == 1
    import json

    objects = [json.loads(line) for line in failed.stdout.decode().splitlines()]
    assert objects[0] == {"run_id": run_id, "turn": 2}
    assert objects[-1]["type"] == "session-error"
    status = cli(shared_env, "status", run_id, "--json")
    assert json.loads(status.stdout)["turns"] == 2
    assert cli(shared_env, "status", "r" + "1" * 24).returncode == 1
    assert cli(shared_env, "run", "nope", "hi").returncode == 2
    assert cli(shared_env, "run", "stdio-json", "", "--executable", DEMO).returncode == 2
    assert cli(shared_env, "run", "stdio-json", "hi", "--posture", "yolo").returncode == 2
    assert cli(shared_env, "cancel", run_id).stdout.decode().strip() == "nothing in flight"


def test_events_follow_streams_a_turn_live_from_a_second_process(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    """The follower is running before the turn is sent, and prints the turn's first text
    while the harness is still sleeping before its last: read live, not replayed at the end."""
    import json
    import os
    import queue
    import threading

    client = shared_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    follower = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "events", run_id, "--follow", "--json"],
        stdout=subprocess.PIPE,
        env={**os.environ, **shared_env.vars},
    )
    lines: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            lines.put((time.time(), json.loads(line)))

    threading.Thread(target=read, daemon=True).start()
    seen: list[tuple[float, dict[str, Any]]] = []

    def next_line(what: str) -> dict[str, Any]:
        try:
            seen.append(lines.get(timeout=30))
        except queue.Empty:
            raise AssertionError(f"the follower printed no {what}: {seen}") from None
        return seen[-1][1]

    try:
        # Following already: turn 1 is printed, up to its terminal, before turn 2 exists.
        while next_line("turn 1")["type"] != "turn-complete":
            pass
        turn = client.submit_turn(run_id, "@text first\n@sleep 1.5\n@text last")
        while next_line(f"turn {turn}")["type"] != "turn-complete":
            pass
    finally:
        follower.terminate()
        follower.wait(10)
    texts = {
        e["data"]["text"]: (read_at, e) for read_at, e in seen if e["type"] == "assistant-text"
    }
    first_read_at, _ = texts["first"]
    _, last = texts["last"]
    assert first_read_at < last["ts"], "'first' was printed only after 'last' was published"
    ids = [e["id"] for _, e in seen if e["id"].startswith(f"{turn}-")]
    assert ids == [f"{turn}-{seq}" for seq in range(len(ids))]


def test_end_during_a_turn_cancels_it_then_tears_down(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id = client.start_run("stdio-json", "@text working\n@sleep 60", executable=DEMO)
    for event in client.events(run_id, follow=True, timeout=30):
        if event.type == "assistant-text":
            break
    assert client.status(run_id)["status"] == "running"
    assert client.end(run_id)["status"] == "ended"
    terminal = client.wait(run_id, 1, timeout=5)
    assert terminal.data["reason"] == "cancelled"
    assert_well_formed(turn_events(client, run_id, 1))
    assert not (shared_env.tmp / "workspaces" / "local" / "run" / run_id).exists()
    assert client.status(run_id)["credential_live"] is False
