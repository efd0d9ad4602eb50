"""Parking and budgets through a real worker process, real Redis and the demo harness.

A limited turn parks its run and the worker sends the input again at the reset (a Celery
countdown, no process waiting), resuming the session; cancel and end work on a parked run; a
parked run survives its worker's death; a budget stops a turn, refuses the next, and raising
it lets the run go on. Resets are 1 to 3 seconds here; the defaults are a fleet's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, demo_executable
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient, StreamEvent
from worker.errors import BudgetSpent, RunBusy

pytestmark = [pytest.mark.redis, pytest.mark.celery]

FAST = {
    "HARNESS_RESEND_AFTER_S": "1",
    "HARNESS_REAP_INTERVAL_S": "1",
    "HARNESS_BACKOFF_BASE_S": "1",
    "HARNESS_BACKOFF_MAX_S": "2",
    "HARNESS_MAX_PARKS": "2",
    "HARNESS_HEARTBEAT_TTL_S": "3",
}


@dataclass
class Deployment:
    env: Env
    client: HarnessClient
    worker: WorkerProcess

    def ensure_worker(self) -> None:
        if self.worker.proc.poll() is not None:
            self.worker = start_worker(self.env)

    def run(self, script: str, **options: Any) -> str:
        return self.client.start_run("stdio-json", script, executable=demo_executable(), **options)

    def turns(self, run_id: str) -> dict[int, list[StreamEvent]]:
        out: dict[int, list[StreamEvent]] = {}
        for event in self.client.events(run_id):
            out.setdefault(event.turn, []).append(event)
        return out

    def harness(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "worker.cli", *argv],
            cwd=ROOT,
            env={**os.environ, **self.env.vars, "PYTHONUNBUFFERED": "1"},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Deployment]:
    env = make_env(tmp_path_factory.mktemp("parking"), redis_url, **FAST)
    worker = start_worker(env)
    found = Deployment(env, env.client(), worker)
    yield found
    found.worker.stop()
    env.close()


@pytest.fixture
def d(deployment: Deployment) -> Deployment:
    deployment.ensure_worker()
    return deployment


def assert_one_terminal_per_turn(turns: dict[int, list[StreamEvent]]) -> None:
    for turn, events in turns.items():
        assert [e.seq for e in events] == list(range(len(events))), turn
        assert events[0].type == "turn-started"
        assert [e.terminal for e in events].count(True) == 1 and events[-1].terminal, turn


def test_a_rate_limited_run_parks_resumes_at_the_reset_and_completes(d: Deployment) -> None:
    run_id = d.run("@limit 1 rate-limited 2\n@complete done after the reset")
    parked = d.client.wait(run_id, 1, timeout=30)
    assert parked.data["reason"] == "rate-limited"
    record = d.client.status(run_id)
    assert record["status"] == "parked" and record["current_turn"] == 2
    assert record["resume_at"] > time.time() + 0.5
    with pytest.raises(RunBusy):
        d.client.submit_turn(run_id, "not now")  # the worker's retry has the turn

    done = d.client.wait(run_id, 2, timeout=30)
    assert done.type == "turn-complete" and done.data["text"] == "done after the reset"
    turns = d.turns(run_id)
    assert_one_terminal_per_turn(turns)
    (event,) = [e for e in turns[1] if e.type == "parked"]
    assert event.data == {
        "resume_at": record["resume_at"],
        "reason": "rate-limited",
        "next_turn": 2,
    }
    assert turns[2][0].ts >= record["resume_at"] - 0.05  # not before the reset
    assert turns[2][0].ts < record["resume_at"] + 3  # and soon after it: a countdown, not a poll
    (s1,) = [e.data for e in turns[1] if e.type == "session"]
    (s2,) = [e.data for e in turns[2] if e.type == "session"]
    assert s2["resumed"] is True and s2["session_id"] == s1["session_id"]
    after = d.client.status(run_id)
    assert (after["status"], after["resume_at"], after["parks"]) == ("idle", None, 1)


def test_follow_prints_the_park_and_goes_on_to_the_retry(d: Deployment) -> None:
    done = d.harness(
        "run",
        "stdio-json",
        "@limit 1 quota 1\n@complete went on",
        "--executable",
        demo_executable(),
        "--follow",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    types = [(line.get("id", "").split("-")[0], line.get("type")) for line in lines[1:]]
    assert ("1", "parked") in types and ("1", "session-error") in types
    assert types[-1] == ("2", "turn-complete")


def test_a_quota_without_a_reset_is_not_retried(d: Deployment) -> None:
    run_id = d.run("@limit 1 quota\n@complete never", on_limit="park")
    terminal = d.client.wait(run_id, 1, timeout=30)
    assert terminal.data["reason"] == "quota" and terminal.data["retryable"] is False
    time.sleep(1.5)
    record = d.client.status(run_id)
    assert (record["status"], record["turns"]) == ("idle", 1)
    assert all(e.type != "parked" for e in d.client.events(run_id))


def test_a_rate_limit_without_a_reset_backs_off_and_parks_are_bounded(d: Deployment) -> None:
    run_id = d.run("@limit 5 rate-limited\n@complete never")  # HARNESS_MAX_PARKS=2
    terminal = d.client.wait(run_id, 3, timeout=40)
    assert terminal.data["reason"] == "rate-limited"
    turns = d.turns(run_id)
    assert sorted(turns) == [1, 2, 3]
    assert_one_terminal_per_turn(turns)
    parks = [e for t in (1, 2) for e in turns[t] if e.type == "parked"]
    assert len(parks) == 2 and all(e.type != "parked" for e in turns[3])
    for park, turn in zip(parks, (1, 2), strict=True):
        delay = park.data["resume_at"] - turns[turn][-1].ts
        assert 0.3 <= delay <= 2.1  # the backoff, with jitter, within its bounds
    assert d.client.status(run_id)["status"] == "idle"


def test_on_limit_fail_leaves_the_retry_to_the_producer(d: Deployment) -> None:
    run_id = d.run("@limit 1 rate-limited 1\n@complete ok", on_limit="fail")
    terminal = d.client.wait(run_id, 1, timeout=30)
    assert terminal.data["retry_after_s"] == 1.0
    assert d.client.status(run_id)["status"] == "idle"
    assert d.client.submit_turn(run_id, "@complete by hand") == 2
    assert d.client.wait(run_id, 2, timeout=30).type == "turn-complete"


def test_cancel_withdraws_a_parked_turn_for_good(d: Deployment) -> None:
    run_id = d.run("@limit 1 rate-limited 2\n@complete must not run")
    d.client.wait(run_id, 1, timeout=30)
    assert d.client.status(run_id)["status"] == "parked"
    assert d.client.cancel(run_id) is True
    cancelled = d.client.wait(run_id, 2, timeout=10)
    assert cancelled.data["reason"] == "cancelled"
    assert d.client.status(run_id)["status"] == "idle"
    time.sleep(3.5)  # past the reset: the countdown's delivery finds the turn ended
    turns = d.turns(run_id)
    assert_one_terminal_per_turn(turns)
    assert [e.type for e in turns[2]] == ["turn-started", "session-error"]
    assert d.client.status(run_id)["turns"] == 2


def test_end_works_on_a_parked_run(d: Deployment) -> None:
    run_id = d.run("@limit 1 rate-limited 2\n@complete must not run")
    d.client.wait(run_id, 1, timeout=30)
    assert d.client.end(run_id, timeout=30)["status"] == "ended"
    time.sleep(3)
    turns = d.turns(run_id)
    assert_one_terminal_per_turn(turns)
    assert turns[2][-1].data["reason"] == "cancelled"


def test_a_token_budget_stops_a_turn_refuses_the_next_and_raising_it_resumes(
    d: Deployment,
) -> None:
    run_id = d.run("@text working\n@usage 100 50\n@sleep 30\n@complete never", max_tokens=100)
    began = time.monotonic()
    stopped = d.client.wait(run_id, 1, timeout=30)
    assert time.monotonic() - began < 15
    assert stopped.data["reason"] == "budget" and stopped.data["retryable"] is False
    record = d.client.status(run_id)
    assert record["budget_exceeded"] == {
        "budget": "max_tokens",
        "limit": 100.0,
        "used": 150.0,
        "over_by": 50.0,
    }
    with pytest.raises(BudgetSpent, match="max_tokens 100, used 150"):
        d.client.submit_turn(run_id, "more")
    refused = d.harness("turn", run_id, "more")
    assert refused.returncode == 2 and "budget" in refused.stderr

    raised = d.harness("budget", run_id, "--max-tokens", "10000", "--json")
    assert raised.returncode == 0, raised.stderr
    shown = json.loads(raised.stdout)
    assert shown["budget"]["max_tokens"] == 10000 and shown["exceeded"] is None
    assert shown["spent"]["tokens"] == 150

    turn = d.client.submit_turn(run_id, "@complete resumed")
    done = d.client.wait(run_id, turn, timeout=30)
    assert done.type == "turn-complete"
    (s1,) = [e.data for e in d.turns(run_id)[1] if e.type == "session"]
    (s2,) = [e.data for e in d.turns(run_id)[turn] if e.type == "session"]
    assert s2["resumed"] is True and s2["session_id"] == s1["session_id"]


def test_a_parked_run_survives_the_death_of_its_worker(d: Deployment) -> None:
    run_id = d.run("@limit 1 rate-limited 3\n@complete after a restart")
    d.client.wait(run_id, 1, timeout=30)
    resume_at = d.client.status(run_id)["resume_at"]
    d.worker.signal(signal.SIGKILL)  # it held the countdown: the broker keeps it unacked
    d.worker.proc.wait(10)
    d.worker = start_worker(d.env)
    done = d.client.wait(run_id, 2, timeout=40)
    assert done.type == "turn-complete", done.data
    started = d.turns(run_id)[2][0].ts
    assert started >= resume_at - 0.05
    assert_one_terminal_per_turn(d.turns(run_id))


def test_a_parked_turn_s_retry_keeps_its_attachments_and_schema(
    d: Deployment, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("the spec\n")
    schema = {"type": "object", "required": ["attachments"]}
    run_id = d.run(
        "@limit 1 rate-limited 1\n@attachments\n@answer-attachments",
        attachments=[notes],
        output_schema=schema,
    )
    parked = d.client.wait(run_id, 1, timeout=30)
    assert parked.data["reason"] == "rate-limited"
    done = d.client.wait(run_id, 2, timeout=30)
    assert done.type == "turn-complete", done.data
    # The retry found the same file, uploaded again for it, and its answer was validated.
    texts = [e.data["text"] for e in d.turns(run_id)[2] if e.type == "assistant-text"]
    digest = hashlib.sha256(b"the spec\n").hexdigest()
    (text,) = texts
    assert text.endswith(f"/.attachments/turn-2/notes.txt application/octet-stream 9 {digest}")
    assert done.data["structured"]["attachments"][0]["sha256"] == digest
