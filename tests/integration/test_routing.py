"""Run affinity: later turns go to the run's host; a gone host fails turns instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

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


def test_turn_for_a_gone_host_fails_at_once(env: Env, workers: list[WorkerProcess]) -> None:
    worker = start_worker(env, HARNESS_HOST_TIMEOUT_S="2")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    worker.stop()
    time.sleep(2.5)  # the host's heartbeat lapses
    started = time.monotonic()
    turn = client.submit_turn(run_id, "second")
    terminal = client.wait(run_id, turn, timeout=5)
    assert time.monotonic() - started < 2
    assert terminal.data["reason"] == "sandbox"
    assert "host of this run's container is gone" in terminal.data["error"]
    record = client.status(run_id)
    assert record["status"] == "failed"
    assert record["last_error"].startswith("sandbox: no worker is consuming")


def test_queued_turn_is_closed_when_its_host_dies(env: Env, workers: list[WorkerProcess]) -> None:
    worker = start_worker(env, HARNESS_HOST_TIMEOUT_S="3")
    workers.append(worker)
    client = env.client()
    run_id = client.start_run("stdio-json", "first", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    worker.proc.send_signal(signal.SIGKILL)  # dies with its heartbeat still fresh
    worker.proc.wait(10)
    turn = client.submit_turn(run_id, "queued for a dead host")
    assert client.status(run_id)["status"] == "running"
    time.sleep(3.5)
    reap = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap"],
        capture_output=True,
        timeout=60,
        env={**os.environ, **env.vars},
    )
    assert reap.returncode == 0, reap.stderr
    terminal = client.wait(run_id, turn, timeout=5)
    assert terminal.data["reason"] == "sandbox"
    assert client.status(run_id)["status"] == "failed"


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
    time.sleep(1.2)
    assert f"sent turn {run_id}/1 again (no worker had taken it)" in _reap(env)
    workers.append(start_worker(env))
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    time.sleep(1)  # a second copy, when there is one, is taken and dropped meanwhile
    events = [e for e in client.events(run_id) if e.turn == 1]
    assert [e.type for e in events].count("session") == 1  # the harness ran once
    assert [e.terminal for e in events].count(True) == 1
