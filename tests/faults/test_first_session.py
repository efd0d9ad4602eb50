"""A worker killed during a run's first turn, after its harness announced a session: the run
record keeps that session from the moment it was announced, so the run's next turn, on
another worker, continues it (docs/events.md, "session")."""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers import assert_one_terminal, wait_for
from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker
from worker.client import HarnessClient

# Mostly waiting on real time (faults, drains, handlers asleep): in the parallel phase.
pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow, pytest.mark.long]


def announced_session(client: HarnessClient, run_id: str, timeout: float = 30) -> str:
    for event in client.events(run_id, follow=True, timeout=timeout):
        if event.type == "session":
            return str(event.data["session_id"])
    raise AssertionError("the turn never announced a session")


def test_a_session_announced_before_the_worker_died_is_resumed_by_the_next_turn(
    env: Env, workers: list[WorkerProcess]
) -> None:
    env.vars["HARNESS_HEARTBEAT_TTL_S"] = "3"
    env.vars["HARNESS_REAP_INTERVAL_S"] = "2"
    first = start_worker(env)
    workers.append(first)
    client = env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 120", executable=DEMO)
    session = announced_session(client, run_id)
    # Recorded as soon as it was announced, while the turn still runs.
    wait_for(
        lambda: client.status(run_id)["session_id"] == session,
        timeout=5,
        what="the announced session in the run record",
    )
    assert client.status(run_id)["status"] == "running"

    first.proc.send_signal(signal.SIGKILL)  # the worker only: no end of its turn is written
    first.proc.wait(10)
    time.sleep(0.5)
    workers.append(start_worker(env))  # its reaper closes the lost turn once the beat lapses
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.data["reason"] == "worker-lost"
    assert_one_terminal([e for e in client.events(run_id) if e.turn == 1])
    record = client.status(run_id)
    assert record["status"] == "idle" and record["session_id"] == session

    turn = client.submit_turn(run_id, "again")
    assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    sessions = [e for e in client.events(run_id) if e.turn == turn and e.type == "session"]
    assert [(e.data["session_id"], e.data["resumed"]) for e in sessions] == [(session, True)]
    record = client.status(run_id)
    assert record["session_id"] == session and record["resumed"] is True
