"""Real faults against real worker processes: signals, crashes, Redis and broker restarts.

After each: exactly one terminal per turn, ids contiguous, the record consistent, no live
credential for a finished run, and no harness process left behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.faults.conftest import PrivateRedis, processes_in
from tests.helpers import assert_one_terminal, wait_for
from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker
from worker.client import HarnessClient, StreamEvent

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def wait_for_text(client: HarnessClient, run_id: str, timeout: float = 30) -> None:
    for event in client.events(run_id, follow=True, timeout=timeout):
        if event.type == "assistant-text":
            return
    raise AssertionError("the turn never produced text")


def assert_no_leftovers(env: Env, client: HarnessClient, run_id: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while processes_in(env.tmp / "workspaces") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_in(env.tmp / "workspaces") == []
    record = client.status(run_id)
    if record["status"] in ("ended", "failed"):
        assert record["credential_live"] is False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_warm_shutdown_stops_inflight_turn_after_grace(
    env: Env, workers: list[WorkerProcess], sig: signal.Signals
) -> None:
    worker = start_worker(env, HARNESS_SHUTDOWN_GRACE_S="1")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 120", executable=DEMO)
    wait_for_text(client, run_id)
    worker.signal(sig)
    terminal = client.wait(run_id, 1, timeout=20)
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "shutdown"
    assert terminal.data["retryable"] is True
    assert worker.proc.wait(20) is not None
    assert_one_terminal(turn_events(client, run_id, 1))
    record = client.status(run_id)
    assert record["status"] == "idle"
    assert record["credential_live"] is False  # the credential leaves with its worker
    assert record["queue"].startswith(f"{env.prefix}.host.")  # the run stays on its host
    assert_no_leftovers(env, client, run_id)
    # The worker that replaces it takes the run's next turn, in the same workspace.
    workspace = env.tmp / "workspaces" / "local" / "run" / run_id
    (workspace / "kept.txt").write_text("before the deploy")
    workers.append(start_worker(env))
    turn = client.submit_turn(run_id, "after the deploy")
    assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    assert (workspace / "kept.txt").read_text() == "before the deploy"


def test_turn_that_ends_within_the_grace_completes_normally(
    env: Env, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(env, HARNESS_SHUTDOWN_GRACE_S="20")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run(
        "stdio-json", "@text working\n@sleep 2\n@complete finished", executable=DEMO
    )
    wait_for_text(client, run_id)
    worker.signal(signal.SIGTERM)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    assert terminal.data["text"] == "finished"
    assert worker.proc.wait(30) == 0


def test_cold_shutdown_stops_turns_before_the_process_exits(
    env: Env, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(env, HARNESS_SHUTDOWN_GRACE_S="60")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run(
        "stdio-json", "@fork 2\n@ignore-term\n@text busy\n@sleep 120", executable=DEMO
    )
    wait_for_text(client, run_id)
    worker.signal(signal.SIGQUIT)
    terminal = client.wait(run_id, 1, timeout=20)
    assert terminal.data["reason"] == "shutdown"
    worker.proc.wait(20)
    assert_one_terminal(turn_events(client, run_id, 1))
    assert_no_leftovers(env, client, run_id)


def test_sigkill_mid_turn_is_closed_as_worker_lost_and_cleaned(
    env: Env, workers: list[WorkerProcess]
) -> None:
    env.vars["HARNESS_HEARTBEAT_TTL_S"] = "2"
    worker = start_worker(env)
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "@fork 1\n@text busy\n@sleep 120", executable=DEMO)
    wait_for_text(client, run_id)
    worker.proc.send_signal(signal.SIGKILL)  # the worker only: its harness is orphaned
    worker.proc.wait(10)
    assert processes_in(env.tmp / "workspaces"), "the orphaned harness should still be running"
    time.sleep(2.5)  # the dead worker's heartbeat expires
    reap = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap", "--json"],
        capture_output=True,
        timeout=60,
        env={**__import__("os").environ, **env.vars},
    )
    assert reap.returncode == 0, reap.stderr
    removed = [json.loads(line)["removed"] for line in reap.stdout.decode().splitlines()]
    assert f"closed turn {run_id}/1 (worker lost)" in removed
    assert f"removed sandbox of run {run_id}" not in removed  # one turn lost, the run is kept
    terminal = client.wait(run_id, 1, timeout=5)
    assert terminal.data["reason"] == "worker-lost"
    assert_one_terminal(turn_events(client, run_id, 1))
    record = client.status(run_id)
    assert record["status"] == "idle"
    assert record["credential_live"] is False
    # A worker on the run's host ends it: the orphaned harness goes with its sandbox.
    workers.append(start_worker(env))
    assert client.end(run_id, timeout=30)["status"] == "ended"
    assert_no_leftovers(env, client, run_id)


def test_restarted_worker_closes_the_turn_its_predecessor_lost_without_beat(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """Killed and restarted at once, while the dead worker's heartbeat is still fresh: the
    start-up pass finds nothing lost; the worker's own reaper timer closes the turn once the
    heartbeat lapses (no beat process anywhere), and the run goes on in its workspace."""
    env.vars["HARNESS_HEARTBEAT_TTL_S"] = "3"
    env.vars["HARNESS_REAP_INTERVAL_S"] = "2"
    first = start_worker(env)
    workers.append(first)
    client = env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 120", executable=DEMO)
    wait_for_text(client, run_id)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    killed_at = time.monotonic()
    workers.append(start_worker(env))
    terminal = client.wait(run_id, 1, timeout=30)
    took = time.monotonic() - killed_at
    assert terminal.data["reason"] == "worker-lost"
    assert took < 3 + 2 + 3, f"closed {took:.1f}s after the kill"
    assert_one_terminal(turn_events(client, run_id, 1))
    assert client.status(run_id)["status"] == "idle"
    turn = client.submit_turn(run_id, "again")
    assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    assert_no_leftovers(env, client, run_id)


def test_redelivered_turn_never_runs_twice(env: Env, workers: list[WorkerProcess]) -> None:
    # Redelivery after 2 s while the turn is still running (a visibility timeout set too
    # short on purpose): the second delivery must find the turn taken and leave it alone.
    env.vars["HARNESS_VISIBILITY_TIMEOUT_S"] = "2"
    workers.append(start_worker(env))
    workers.append(start_worker(env, HARNESS_HOST_QUEUE=f"{env.prefix}.host.second"))
    client = env.client()
    run_id = client.start_run("stdio-json", "@stream 6 1", executable=DEMO)
    wait_for_text(client, run_id)
    # kombu sweeps for overdue unacknowledged messages only every ~100 s (10 s timer, every
    # 10th call), longer than this turn: run its sweep now, as a worker would, so that the
    # copy is really handed out again while the turn runs.
    time.sleep(2.2)  # deliberately: the visibility timeout (2 s) lapses
    with client.app.connection_for_write() as conn:
        conn.default_channel.qos.restore_visible(num=100, interval=1)
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "turn-complete"
    # The copy the broker redelivered reached a worker, which saw the turn taken and dropped it.
    wait_for(
        lambda: any("turn.duplicate_" in w.logs() for w in workers),
        timeout=15,
        what="the redelivered copy taken and dropped",
    )
    events = turn_events(client, run_id, 1)
    assert_one_terminal(events)
    assert [e.type for e in events].count("session") == 1  # the harness ran once
    assert [e.type for e in events].count("assistant-text") == 6


def test_redis_restart_mid_turn_loses_and_duplicates_nothing(
    env: Env, workers: list[WorkerProcess], private_redis: PrivateRedis
) -> None:
    env.vars["HARNESS_REDIS_URL"] = private_redis.url  # streams and records; broker unchanged
    workers.append(start_worker(env))
    client = env.client()
    run_id = client.start_run("stdio-json", "@stream 40 0.1", executable=DEMO)
    wait_for_text(client, run_id)
    private_redis.restart(down_for_s=1.5)
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "turn-complete"
    events = turn_events(client, run_id, 1)
    assert_one_terminal(events)
    texts = [e.data["text"] for e in events if e.type == "assistant-text"]
    assert texts == [f"line {i}" for i in range(40)]


def test_broker_restart_mid_turn(
    env: Env, workers: list[WorkerProcess], private_redis: PrivateRedis
) -> None:
    env.vars["HARNESS_BROKER_URL"] = private_redis.url  # the broker alone restarts
    worker = start_worker(env)
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "@stream 20 0.1", executable=DEMO)
    wait_for_text(client, run_id)
    private_redis.restart(down_for_s=1.0)
    # The in-flight turn finishes and publishes normally: it does not need the broker.
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    assert_one_terminal(turn_events(client, run_id, 1))
    # The worker outlived the outage (worker/broker.py): no unrecoverable error, still up.
    assert worker.proc.poll() is None
    assert "Unrecoverable error" not in worker.logs()
    client.submit_turn(run_id, "after the restart")
    assert client.wait(run_id, 2, timeout=60).type == "turn-complete"


def test_stubborn_harness_is_killed_with_its_children_on_cancel(
    env: Env, workers: list[WorkerProcess]
) -> None:
    workers.append(start_worker(env))
    client = env.client()
    run_id = client.start_run(
        "stdio-json", "@fork 3\n@ignore-term\n@text busy\n@sleep 120", executable=DEMO
    )
    wait_for_text(client, run_id)
    started = time.monotonic()
    client.cancel(run_id)
    terminal = client.wait(run_id, 1, timeout=10)
    assert time.monotonic() - started < 2.5
    assert terminal.data["reason"] == "cancelled"
    assert_no_leftovers(env, client, run_id, timeout=1)


def _flood(env: Env, workers: list[WorkerProcess], **settings: str) -> list[StreamEvent]:
    """The events of a 50,000-line flood's turn, through a worker with these settings, once
    it completed with one terminal."""
    workers.append(start_worker(env, **settings))
    client = env.client()
    run_id = client.start_run("stdio-json", "@flood 50000", executable=DEMO)
    terminal = client.wait(run_id, 1, timeout=120)
    assert terminal.type == "turn-complete"
    events = turn_events(client, run_id, 1)
    assert_one_terminal(events)
    return events


def test_flooding_harness_loses_no_event(env: Env, workers: list[WorkerProcess]) -> None:
    events = _flood(env, workers)
    texts = [e.data["text"] for e in events if e.type == "assistant-text"]
    assert texts == [f"flood {i}" for i in range(50000)]


def test_flood_coalesced_loses_no_text_and_keeps_the_ids(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """HARNESS_COALESCE_TEXT_CHARS: the flood's lines read together become fewer entries, each
    within the bound, their text the same text in the same order; ids stay {turn}-{seq}."""
    events = _flood(env, workers, HARNESS_COALESCE_TEXT_CHARS="4096")
    assert [e.id for e in events] == [f"1-{seq}" for seq in range(len(events))]
    texts = [e.data["text"] for e in events if e.type == "assistant-text"]
    assert "".join(texts) == "".join(f"flood {i}" for i in range(50000))
    assert all(len(text) <= 4096 for text in texts)
    assert len(texts) < 50000 // 10, len(texts)
