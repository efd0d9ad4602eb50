"""``harness fork`` through a real worker in the local sandbox: a fork at turn 2 of a 3-turn
run starts from turn 2's workspace, its first turn's input carries turns 1 and 2 (not 3),
the replay is reported as ``source: replay``, the record names its parent; the fork is its
parent's tenant's; bad turns are refused."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from worker.errors import InvalidInput

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RECORDER = """#!/usr/bin/env python3
import json, os, sys, uuid
text = sys.stdin.read()
home = os.environ["HOME"]
with open(os.path.join(home, "inputs.jsonl"), "a") as seen:
    seen.write(json.dumps(text) + "\\n")
session = os.environ.get("HARNESS_RESUME_SESSION") or uuid.uuid4().hex
print(json.dumps({"type": "session", "id": session, "model": "recorder-1"}), flush=True)
print(json.dumps({"type": "complete", "text": "answer to " + text.strip()[-12:]}), flush=True)
"""


@pytest.fixture(scope="module")
def fork_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("fork"), redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def fork_worker(fork_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(fork_env)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def recorder(fork_env: Env) -> str:
    path = fork_env.tmp / "recorder.py"
    path.write_text(RECORDER)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def workspace(env: Env, run_id: str) -> Path:
    return env.tmp / "workspaces" / "local" / "run" / run_id


def inputs(env: Env, run_id: str) -> list[str]:
    lines = (workspace(env, run_id) / ".home" / "inputs.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def three_turns(env: Env, recorder: str) -> str:
    """Turn N sees file N-1 written before it: turn 2's snapshot has one.txt and two.txt,
    turn 3's three.txt too."""
    client = env.client()
    run_id = client.start_run("stdio-json", "first question", executable=recorder)
    client.wait(run_id, 1, timeout=30)
    for turn, name in ((2, "two"), (3, "three")):
        if turn == 2:
            (workspace(env, run_id) / "one.txt").write_text("1\n")
        (workspace(env, run_id) / f"{name}.txt").write_text(f"{turn}\n")
        assert client.submit_turn(run_id, f"question {name}") == turn
        assert client.wait(run_id, turn, timeout=30).type == "turn-complete"
    return run_id


def test_a_fork_at_turn_two_starts_from_turn_two(
    fork_env: Env, fork_worker: WorkerProcess, recorder: str
) -> None:
    client = fork_env.client()
    parent = three_turns(fork_env, recorder)
    fork = client.fork(parent, "what next?", at_turn=2, labels={"why": "try"})
    assert fork != parent
    assert client.wait(fork, 1, timeout=60).type == "turn-complete"
    files = sorted(
        p.name for p in workspace(fork_env, fork).iterdir() if not p.name.startswith(".")
    )
    assert files == ["one.txt", "two.txt"]
    [seen] = inputs(fork_env, fork)
    assert "first question" in seen and "question two" in seen
    assert "question three" not in seen
    assert seen.endswith("what next?")
    record = client.status(fork)
    assert record["forked_from"] == parent and record["forked_at_turn"] == 2
    assert record["labels"] == {"why": "try"}
    events = [e for e in client.events(fork) if e.turn == 1]
    [replay] = [e for e in events if e.type == "usage" and e.data["source"] == "replay"]
    assert replay.data["input_tokens"] > 0
    assert events[0].type == "turn-started"
    assert events[0].data["input_chars"] == len(seen)  # what the harness was given
    # A fork goes on as any run: its next turn resumes its own session.
    assert client.submit_turn(fork, "and then?") == 2
    assert client.wait(fork, 2, timeout=30).type == "turn-complete"
    assert inputs(fork_env, fork)[1] == "and then?"


def test_a_fork_at_turn_zero_is_the_seed_and_no_conversation(
    fork_env: Env, fork_worker: WorkerProcess, recorder: str
) -> None:
    client = fork_env.client()
    parent = three_turns(fork_env, recorder)
    fork = client.fork(parent, "from scratch", at_turn=0)
    assert client.wait(fork, 1, timeout=60).type == "turn-complete"
    assert [p.name for p in workspace(fork_env, fork).iterdir() if not p.name.startswith(".")] == []
    assert inputs(fork_env, fork) == ["from scratch"]


def test_a_fork_keeps_the_parents_tenant_and_refuses_unfinished_turns(
    fork_env: Env, fork_worker: WorkerProcess, recorder: str
) -> None:
    client = fork_env.client()
    parent = client.start_run("stdio-json", "hi", executable=recorder, tenant="acme")
    client.wait(parent, 1, timeout=30)
    for bad in (2, -1, True, "1"):
        with pytest.raises(InvalidInput, match="turns 0 to 1"):
            client.fork(parent, "x", at_turn=bad)  # type: ignore[arg-type]
    fork = client.fork(parent, "hello again")
    assert client.status(fork)["tenant"] == "acme"
    assert client.wait(fork, 1, timeout=60).type == "turn-complete"
