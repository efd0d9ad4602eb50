"""Attempts side by side through a real worker in the local sandbox: three runs from one
input under one group, compared (outcome, answer, diff stats, tokens), the diff of two,
one picked (the others ended, the picked one goes on), a second pick refused, another
tenant kept out, a refused attempt leaving nothing half-made."""

from __future__ import annotations

import stat
from collections.abc import Iterator

import pytest

from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.errors import AnswerRefused, InvalidInput, RunNotFound

pytestmark = [pytest.mark.redis, pytest.mark.celery]

WRITER = """#!/usr/bin/env python3
import json, os, sys, uuid
sys.stdin.read()
mark = uuid.uuid4().hex[:8]
with open("answer.txt", "w") as out:
    out.write("line one\\n" + mark + "\\n")
print(json.dumps({"type": "session", "id": uuid.uuid4().hex, "model": "writer-1"}), flush=True)
print(json.dumps({"type": "usage", "input_tokens": 10, "output_tokens": 3}), flush=True)
print(json.dumps({"type": "complete", "text": "wrote " + mark}), flush=True)
"""


@pytest.fixture(scope="module")
def group_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("attempts"), redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def group_worker(group_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(group_env)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def writer(group_env: Env) -> str:
    path = group_env.tmp / "writer.py"
    path.write_text(WRITER)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def test_three_attempts_compared_and_one_picked(
    group_env: Env, group_worker: WorkerProcess, writer: str
) -> None:
    client = group_env.client()
    started = client.start_attempts("stdio-json", "write it", attempts=3, executable=writer)
    group, runs = started["group"], started["runs"]
    assert len(set(runs)) == 3
    for run_id in runs:
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    table = client.attempts(group)
    assert [row["index"] for row in table["attempts"]] == [1, 2, 3]
    assert table["picked"] is None
    for row, run_id in zip(table["attempts"], runs, strict=True):
        assert row["run_id"] == run_id and row["outcome"] == "complete"
        assert row["diff"] == {"files": 1, "lines_added": 2, "lines_removed": 0}
        assert row["input_tokens"] == 10 and row["output_tokens"] == 3
        assert row["answer"].startswith("wrote ")
        record = client.status(run_id)
        assert record["group"] == group and record["labels"]["group"] == group
    assert [client.status(r)["attempt"] for r in runs] == [1, 2, 3]
    listed = client.list_runs(labels={"group": group})["runs"]
    assert sorted(r["run_id"] for r in listed) == sorted(runs)

    diff = client.attempts_diff(group, 1, 2)
    first, second = (row["answer"].split()[1] for row in table["attempts"][:2])
    assert f"-{first}\n" in diff and f"+{second}\n" in diff and " line one\n" in diff

    picked = client.pick(group, 2, export_to=group_env.tmp / "picked.tar.gz")
    assert picked["run_id"] == runs[1] and sorted(picked["ended"]) == sorted([runs[0], runs[2]])
    assert (group_env.tmp / "picked.tar.gz").stat().st_size > 0
    for run_id in (runs[0], runs[2]):
        deadline_status = client.end(run_id)["status"]  # idempotent: waits for the teardown
        assert deadline_status == "ended"
    assert client.submit_turn(runs[1], "go on") == 2  # the picked one is a normal run
    assert client.wait(runs[1], 2, timeout=30).type == "turn-complete"
    assert client.pick(group, 2)["picked"] == 2  # the same pick again answers the same
    with pytest.raises(AnswerRefused, match="attempt 2 was picked"):
        client.pick(group, 3)
    assert client.attempts(group)["picked"] == 2


def test_attempts_spread_over_harness_lists_and_tenants_are_kept_apart(
    group_env: Env, group_worker: WorkerProcess, writer: str
) -> None:
    client = group_env.client()
    started = client.start_attempts(
        ["stdio-json"], "hello", attempts=2, executable=DEMO, tenant="acme"
    )
    group = started["group"]
    with pytest.raises(RunNotFound):
        client.attempts(group)  # not a run made without a tenant
    with pytest.raises(RunNotFound):
        client.attempts(group, tenant="other")
    assert len(client.attempts(group, tenant="acme")["attempts"]) == 2
    with pytest.raises(InvalidInput, match="1 to 16"):
        client.start_attempts("stdio-json", "x", attempts=17, executable=DEMO)
    with pytest.raises(InvalidInput, match="group id"):
        client.attempts("../../etc")


def test_a_refused_attempt_leaves_no_group(group_env: Env, group_worker: WorkerProcess) -> None:
    client = group_env.client()
    before = set(client.redis.scan_iter(f"{client.keys.prefix}:group:*"))
    with pytest.raises(InvalidInput):
        client.start_attempts("stdio-json,nope", "hi", attempts=2, executable=DEMO)
    assert set(client.redis.scan_iter(f"{client.keys.prefix}:group:*")) == before
