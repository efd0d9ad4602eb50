"""A producer is told what is going on: a followed turn no worker takes is said to wait, a
bound gives up with its exit status, and a worker that comes later picks the follow up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.worker import IsolatedEnv, WorkerProcess, demo_executable, make_env, start_worker
from tests.conftest import ROOT
from worker.errors import TurnWaitTimeout

pytestmark = [pytest.mark.redis]


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> Iterator[IsolatedEnv]:
    isolated = make_env(tmp_path, redis_url)
    yield isolated
    isolated.close()


@dataclass
class Command:
    """``harness ARGV`` as a subprocess, its output lines collected with when they came."""

    proc: subprocess.Popen[str]
    began: float = field(default_factory=time.monotonic)
    out: list[tuple[float, str]] = field(default_factory=list)
    err: list[tuple[float, str]] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            reader = threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read(self, stream: Any, lines: list[tuple[float, str]]) -> None:
        for line in stream:
            lines.append((time.monotonic() - self.began, line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        for reader in self.readers:  # each ends at its pipe's end, once it has read it all
            reader.join(10)
            assert not reader.is_alive(), "a pipe of the exited command stayed open"
        return code

    def first(self, lines: list[tuple[float, str]], text: str, within: float) -> float:
        """When a line containing ``text`` came, waiting up to ``within`` seconds for it."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for at, line in list(lines):
                if text in line:
                    return at
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} within {within}s: {lines}")


def harness(env: IsolatedEnv, *argv: str) -> Command:
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *argv],
        cwd=ROOT,
        env={**os.environ, **env.vars, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Command(proc)


RUN = ("run", "stdio-json", "hello", "--sandbox", "local", "--follow")


def test_follow_with_no_worker_says_it_waits_and_gives_up_at_the_bound(env: IsolatedEnv) -> None:
    command = harness(env, *RUN, "--executable", demo_executable(), "--wait", "8")
    queue = f"{env.prefix}.stdio-json"
    said = command.first(command.err, f"harness: waiting for a worker on {queue} since", 10)
    assert said < 4
    code = command.wait(30)
    assert code == TurnWaitTimeout.exit_code == 124
    run_id = command.out[0][1]
    assert run_id.startswith("r") and len(run_id) == 25
    gave_up = command.first(command.err, "no worker started turn 1", 1)
    assert 7.5 <= gave_up < 12
    assert f"`harness cancel {run_id}` withdraws it" in command.err[-1][1]

    # The turn stays queued, and `harness status` says so.
    status = harness(env, "status", run_id)
    assert status.wait(30) == 0
    waiting = [line for _, line in status.out if line.startswith("waiting ")]
    assert waiting and f"waiting for a worker on {queue} since" in waiting[0]


def test_follow_json_says_it_waits_as_a_notice_line(env: IsolatedEnv) -> None:
    command = harness(env, *RUN, "--executable", demo_executable(), "--wait", "3", "--json")
    assert command.wait(30) == 124
    lines = [json.loads(line) for _, line in command.out]
    assert set(lines[0]) == {"run_id", "turn"}
    assert lines[1]["notice"] == "waiting" and lines[1]["queue"] == f"{env.prefix}.stdio-json"
    assert lines[1]["bound_s"] is None


@pytest.mark.celery
@pytest.mark.slow
def test_follow_goes_on_when_a_worker_comes(env: IsolatedEnv) -> None:
    command = harness(env, *RUN, "--executable", demo_executable(), "--wait", "120")
    command.first(command.err, "harness: waiting for a worker on", 10)
    time.sleep(2)  # deliberately: a follower with no worker in sight keeps waiting meanwhile
    worker: WorkerProcess = start_worker(env)
    try:
        assert command.wait(90) == 0, command.err
    finally:
        worker.stop()
    printed = [line for _, line in command.out]
    assert "✓ turn 1 complete" in printed
    assert any(line.startswith("── turn 1") for line in printed)
    assert len([line for _, line in command.err if "waiting for a worker" in line]) == 1


def test_end_says_what_it_waits_for_and_ends_the_run_without_a_worker(env: IsolatedEnv) -> None:
    client = env.client()
    run_id = client.start_run("stdio-json", "hello", executable=demo_executable())
    notices: list[dict[str, Any]] = []
    record = client.end(run_id, timeout=2.5, on_wait=notices.append)
    assert record["status"] == "ended"
    assert [n["for"] for n in notices] == ["teardown"]
    assert notices[0]["queue"] == f"{env.prefix}.stdio-json"
    assert notices[0]["alive"] is False and notices[0]["timeout_s"] == 2.5
