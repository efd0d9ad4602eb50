"""Run affinity: later turns go to the run's host; a host that is away is waited for, and a
turn that waited too long ends without costing the run its files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sandbox.identity import local_name
from tests.helpers import assert_one_terminal, wait_for
from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def test_later_turns_are_routed_to_the_run_host_queue(
    env: Env, workers: list[WorkerProcess]
) -> None:
    a = start_worker(env, HARNESS_HOST_QUEUE=f"{env.prefix}.host.a")
    b = start_worker(env, HARNESS_HOST_QUEUE=f"{env.prefix}.host.b", HARNESS_HARNESS_QUEUES="codex")
    workers += [a, b]
    client = env.client()
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    assert client.status(run_id)["queue"] == f"{env.prefix}.host.a"  # b does not serve stdio-json
    for turn in range(2, 5):
        client.submit_turn(run_id, f"turn {turn}")
        assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    assert a.logs().count("Task harness.run_turn") >= 4
    assert "Task harness.run_turn" not in b.logs()


def test_a_turn_for_a_host_that_is_away_waits_for_a_worker_there(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """Default host queue (this machine, for the local sandbox), no beat: a deploy restarts
    the run's only worker; the turn sent meanwhile waits and then runs in the same workspace."""
    worker = start_worker(env, HARNESS_HOST_TIMEOUT_S="2")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    queue = client.status(run_id)["queue"]
    assert queue == f"{env.prefix}.host.{local_name(socket.gethostname())}"
    workspace = env.tmp / "workspaces" / "local" / "run" / run_id
    (workspace / "kept.txt").write_text("work of turn 1")
    worker.stop()
    time.sleep(2.5)  # the host's heartbeat lapses: it is away
    turn = client.submit_turn(run_id, "second")
    time.sleep(3)  # deliberately: time passes with no worker there, and the turn only waits
    record = client.status(run_id)
    assert record["status"] == "running"  # waiting, not failed
    assert [e for e in client.events(run_id) if e.turn == turn] == []
    workers.append(start_worker(env, HARNESS_HOST_TIMEOUT_S="2"))
    assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    assert (workspace / "kept.txt").read_text() == "work of turn 1"


def test_a_turn_that_waited_past_the_bound_ends_but_the_run_and_its_files_stay(
    env: Env, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(env, HARNESS_HOST_TIMEOUT_S="3")
    workers.append(worker)
    client = env.client(host_wait_s=2)
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    workspace = env.tmp / "workspaces" / "local" / "run" / run_id
    (workspace / "kept.txt").write_text("work of turn 1")
    worker.proc.send_signal(signal.SIGKILL)  # dies with its heartbeat still fresh
    worker.proc.wait(10)
    turn = client.submit_turn(run_id, "queued for a host that is away")
    assert client.status(run_id)["status"] == "running"
    time.sleep(3.5)  # the heartbeat lapses and the turn has waited past HARNESS_HOST_WAIT_S
    reap = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap"],
        capture_output=True,
        timeout=60,
        env={**os.environ, **env.vars, "HARNESS_HOST_WAIT_S": "2"},
    )
    assert reap.returncode == 0, reap.stderr
    assert f"closed turn {run_id}/{turn} (its host had no worker for too long)" in (
        reap.stdout.decode()
    )
    terminal = client.wait(run_id, turn, timeout=5)
    assert terminal.data["reason"] == "sandbox"
    assert terminal.data["retryable"] is True
    assert "HARNESS_HOST_WAIT_S" in terminal.data["error"]
    record = client.status(run_id)
    assert record["status"] == "idle"
    assert (workspace / "kept.txt").exists()
    # The worker comes back: the run goes on where it was.
    workers.append(start_worker(env, HARNESS_HOST_TIMEOUT_S="3"))
    after = client.submit_turn(run_id, "and now")
    assert client.wait(run_id, after, timeout=30).type == "turn-complete"
    assert (workspace / "kept.txt").read_text() == "work of turn 1"


def test_end_without_a_live_worker_still_ends_the_run(
    env: Env, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(env)
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    worker.stop()
    record = client.end(run_id, timeout=1)
    assert record["status"] == "ended"
    assert record["last_error"].startswith("end: no worker consuming")
    assert client.status(run_id)["credential_live"] is False
    # The next worker on that host removes the sandbox of the ended run at start-up.
    workspace = env.tmp / "workspaces" / "local" / "run" / run_id
    assert workspace.exists()
    workers.append(start_worker(env))
    deadline = time.monotonic() + 15  # the start-up reap runs just after the worker is ready
    while workspace.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workspace.exists()


def _reap(env: Env) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap"],
        capture_output=True,
        timeout=60,
        env={**os.environ, **env.vars},
        check=True,
    )
    return done.stdout.decode().splitlines()


@pytest.mark.parametrize("message_lost", [True, False])
def test_turn_no_worker_took_is_sent_again_and_runs_once(
    env: Env, workers: list[WorkerProcess], message_lost: bool
) -> None:
    env.vars["HARNESS_RESEND_AFTER_S"] = "1"
    client = env.client()
    run_id = client.start_run("stdio-json", "hello again", executable=DEMO)  # no worker yet
    if message_lost:
        assert env.redis().delete(f"{env.prefix}.stdio-json") == 1  # the broker loses it
    resent = f"sent turn {run_id}/1 again (no worker had taken it)"
    # HARNESS_RESEND_AFTER_S is 1: the reaper re-sends only a turn queued longer than that.
    wait_for(lambda: resent in _reap(env), timeout=10, interval=0.3, what=resent)
    queue = f"{env.prefix}.stdio-json"
    assert env.redis().llen(queue) == (1 if message_lost else 2)  # the copies really exist
    # The worker's own reaper keeps the default window: its first pass, at start, must not
    # add a third copy of a turn still queued (harmless, but not what is counted here).
    worker = start_worker(env, HARNESS_RESEND_AFTER_S="300")
    workers.append(worker)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    wait_for(lambda: env.redis().llen(queue) == 0, timeout=10, what="every copy taken")
    if not message_lost:  # the second copy was delivered, seen as this turn's, and dropped
        try:
            wait_for(lambda: "turn.duplicate_" in worker.logs(), timeout=20, what="duplicate seen")
        except AssertionError as exc:  # say what became of the second copy
            tasks = [line for line in worker.logs().splitlines() if "run_turn" in line]
            raise AssertionError(f"{exc}; the worker's task lines:\n" + "\n".join(tasks)) from exc
    else:
        assert "turn.duplicate_" not in worker.logs()
    events = [e for e in client.events(run_id) if e.turn == 1]
    assert [e.type for e in events].count("session") == 1  # the harness ran once
    assert assert_one_terminal(events, turn=1).id == terminal.id
