"""Outcomes through a real worker in the local sandbox: a grader refuses twice and accepts
the third time (three ``outcome-evaluation`` events, turns 2 and 3 started with its feedback,
the record ``satisfied`` after 3 iterations, the grader's spend in the run's totals);
``--max-iterations`` reached; a ``--max-tokens`` budget the grader's spend crosses."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.unit.test_outcomes import PROGRAM

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def outcome_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("outcomes"), redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def outcome_worker(outcome_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(outcome_env)
    yield worker
    worker.stop()


def program(tmp_path: Path, accept_at: int) -> str:
    """The agent and its grader (the run's own harness runs the run's executable), in a
    folder of its own: the grader accepts at its ``accept_at``-th call."""
    path = tmp_path / "bin" / "agent"
    path.parent.mkdir()
    path.write_text(PROGRAM)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (path.parent / "mode").write_text(str(accept_at))
    return str(path)


def test_refused_twice_then_accepted(
    outcome_env: Env, outcome_worker: WorkerProcess, tmp_path: Path
) -> None:
    client = outcome_env.client()
    run_id = client.start_run(
        "stdio-json", "write it", executable=program(tmp_path, 3),
        outcome="work.txt holds the feedback of two rounds", max_iterations=5,
    )  # fmt: skip
    assert client.wait(run_id, 3, timeout=120).type == "turn-complete"
    events = list(client.events(run_id))
    evaluations = [e for e in events if e.type == "outcome-evaluation"]
    assert [(e.turn, e.data["iteration"], e.data["satisfied"]) for e in evaluations] == [
        (1, 1, False), (2, 2, False), (3, 3, True),
    ]  # fmt: skip
    for turn, evaluation in ((2, evaluations[0]), (3, evaluations[1])):
        said = [e for e in events if e.turn == turn and e.type == "user-message"]
        assert [m.data["text"] for m in said] == [evaluation.data["feedback"]]
        assert said[0].data["by"] == f"grader:{evaluation.data['grader_run_id']}"
        assert said[0].data["delivery"] == "next-turn"
    graders = [e for e in events if e.type == "usage" and e.data["source"] == "grader"]
    assert [e.turn for e in graders] == [1, 2, 3]
    record = client.status(run_id)
    assert (record["outcome"], record["outcome_iterations"], record["turns"]) == (
        "satisfied", 3, 3,
    )  # fmt: skip
    harness_in = sum(
        e.data["input_tokens"]
        for e in events
        if e.type == "usage" and e.data["source"] == "harness"
    )
    assert record["input_tokens"] == harness_in + 3 * 1000
    assert record["cost_usd"] == pytest.approx(3 * 0.01 + 3 * 0.5)
    for evaluation in evaluations:
        grader = client.status(evaluation.data["grader_run_id"])
        assert grader["status"] == "ended" and grader["labels"] == {"graded-run": run_id}


def test_max_iterations(outcome_env: Env, outcome_worker: WorkerProcess, tmp_path: Path) -> None:
    client = outcome_env.client()
    run_id = client.start_run(
        "stdio-json", "try", executable=program(tmp_path, 99), outcome="never", max_iterations=2
    )
    assert client.wait(run_id, 2, timeout=120).type == "turn-complete"
    record = client.status(run_id)
    assert (record["outcome"], record["outcome_iterations"], record["turns"]) == (
        "max-iterations", 2, 2,
    )  # fmt: skip
    assert not outcome_env.redis().exists(outcome_env.keys.inbox(run_id))


def test_the_graders_spend_crosses_the_budget(
    outcome_env: Env, outcome_worker: WorkerProcess, tmp_path: Path
) -> None:
    client = outcome_env.client()
    run_id = client.start_run(
        "stdio-json", "try", executable=program(tmp_path, 99), outcome="never",
        max_iterations=5, max_tokens=1000,
    )  # fmt: skip
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    record = client.status(run_id)
    assert (record["outcome"], record["outcome_iterations"], record["turns"]) == (
        "unsatisfied", 1, 1,
    )  # fmt: skip
    assert "max_tokens" in record["last_error"]
    assert record["input_tokens"] + record["output_tokens"] == 15 + 1050
    assert not outcome_env.redis().exists(outcome_env.keys.inbox(run_id))
