"""Outcomes on fakeredis with the local sandbox: a grader run (its own record, sandbox and
stream) judges each completed turn, its verdict is an ``outcome-evaluation`` of that turn, its
spend a ``usage`` of source ``grader`` in the run's totals, its feedback the next turn's input
(delivered through the inbox, as the broker would: the turns sent are run here in order)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.unit import test_execute_turn
from tests.unit.test_execute_turn import World
from worker.fleet.lifecycle import end_run
from worker.options.spec import TurnPayload
from worker.outcomes import grader as grading
from worker.turn.execute import execute_turn

make_world = test_execute_turn.make_world

# One program for both sides (the grader is the run's own harness, so it runs the run's
# executable): a grader's input holds "<rubric>"; it refuses until it has been asked
# ACCEPT_AT times (counted in a file beside it), then accepts. The agent writes a file.
PROGRAM = """#!/usr/bin/env python3
import json, os, sys
text = sys.stdin.read()
here = os.path.dirname(os.path.abspath(__file__))
def emit(line): print(json.dumps(line), flush=True)
emit({"type": "session", "id": "s-" + str(os.getpid()), "model": "m-1"})
if "<rubric>" in text:
    with open(os.path.join(here, "inputs.jsonl"), "a") as seen:
        seen.write(json.dumps(text) + "\\n")
    counter = os.path.join(here, "count")
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(n))
    mode = open(os.path.join(here, "mode")).read().strip()
    emit({"type": "usage", "input_tokens": 1000, "output_tokens": 50, "cost_usd": 0.5})
    if mode == "prose":
        emit({"type": "complete", "text": "it looks fine to me"})
    else:
        ok = n >= int(mode)
        emit({"type": "complete", "text": json.dumps(
            {"satisfied": ok, "feedback": "looks right" if ok else f"add tests (round {n})"})})
else:
    with open("work.txt", "a") as out:
        out.write(text + "\\n")
    emit({"type": "usage", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.01})
    emit({"type": "complete", "text": "done: " + text[:40]})
"""


@pytest.fixture
def world(make_world: Any, tmp_path: Path) -> World:
    made: World = make_world()
    program = tmp_path / "bin" / "agent"
    program.parent.mkdir()
    program.write_text(PROGRAM)
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    made.executable = str(program)
    made.deps.end_run = end_run
    sent: list[dict[str, Any]] = []
    made.deps.send_turn = lambda payload, queue, countdown: sent.append(payload)
    made.sent = sent  # type: ignore[attr-defined]
    return made


def accept_at(world: World, n: int | str) -> None:
    (Path(world.executable).parent / "mode").write_text(str(n))


def drive(world: World, run_id: str, text: str) -> None:
    """The first turn, then every turn the run's inbox sends, as a broker would deliver."""
    world.turn(run_id, text)
    sent: list[dict[str, Any]] = world.sent  # type: ignore[attr-defined]
    while sent:
        execute_turn(world.deps, TurnPayload.model_validate(sent.pop(0)))


def evaluations(world: World, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(i, d) for i, kind, d in world.events(run_id) if kind == "outcome-evaluation"]


def test_refused_twice_then_accepted(world: World) -> None:
    accept_at(world, 3)
    run_id = world.run(outcome="a work.txt with three lines", max_iterations=5)
    assert world.store.record(run_id).outcome == "in-progress"
    drive(world, run_id, "write it")
    record = world.store.record(run_id)
    assert (record.outcome, record.outcome_iterations, record.turns) == ("satisfied", 3, 3)
    assert record.last_error is None
    found = evaluations(world, run_id)
    assert [(i.split("-")[0], d["iteration"], d["satisfied"]) for i, d in found] == [
        ("1", 1, False), ("2", 2, False), ("3", 3, True),
    ]  # fmt: skip
    assert found[0][1]["feedback"] == "add tests (round 1)"
    # Each evaluation comes before its turn's terminal; its usage, source grader, before it.
    for turn in (1, 2, 3):
        kinds = [kind for _, kind, _ in world.events(run_id, turn)]
        assert kinds[-3:] == ["usage", "outcome-evaluation", "turn-complete"]
        usage = world.events(run_id, turn)[-3][2]
        assert usage["source"] == "grader" and usage["input_tokens"] == 1000
    # Turns 2 and 3 began with the feedback, as a user-message of the grader's run.
    for turn, (_, evaluation) in zip((2, 3), found[:2], strict=True):
        said = [d for _, kind, d in world.events(run_id, turn) if kind == "user-message"]
        assert [m["text"] for m in said] == [evaluation["feedback"]]
        assert said[0]["by"] == f"grader:{evaluation['grader_run_id']}"
    # The run's totals hold its three turns and its three gradings.
    assert record.input_tokens == 3 * 10 + 3 * 1000
    assert record.output_tokens == 3 * 5 + 3 * 50
    assert record.cost_usd == pytest.approx(3 * 0.01 + 3 * 0.5)
    # Each grader was a run of its own, ended: its record, its sandbox gone.
    graders = {d["grader_run_id"] for _, d in found}
    assert len(graders) == 3
    for grader_id in graders:
        held = world.store.record(grader_id)
        assert held.status == "ended" and held.labels == {"graded-run": run_id}
        assert held.options is not None and held.options.output_schema == grading.VERDICT_SCHEMA
        assert not world.workspace(grader_id).exists()


def test_the_grader_reads_the_rubric_the_answer_and_the_diff(world: World) -> None:
    accept_at(world, 1)
    run_id = world.run(outcome="RUBRIC-TEXT")
    drive(world, run_id, "write it")
    lines = (Path(world.executable).parent / "inputs.jsonl").read_text().splitlines()
    seen = json.loads(lines[0])
    assert "<rubric>\nRUBRIC-TEXT\n</rubric>" in seen
    assert "done: write it" in seen
    assert "+++ b/work.txt" in seen and "+write it" in seen


def test_max_iterations_stops_unsatisfied(world: World) -> None:
    accept_at(world, 99)
    run_id = world.run(outcome="never met", max_iterations=2)
    drive(world, run_id, "try")
    record = world.store.record(run_id)
    assert (record.outcome, record.outcome_iterations, record.turns) == ("max-iterations", 2, 2)
    assert [d["satisfied"] for _, d in evaluations(world, run_id)] == [False, False]
    assert not world.client.exists(world.keys.inbox(run_id))


def test_a_budget_the_grader_crosses_stops_the_loop(world: World) -> None:
    accept_at(world, 99)
    run_id = world.run(outcome="never met", max_iterations=5, max_tokens=1000)
    drive(world, run_id, "try")
    record = world.store.record(run_id)
    # Turn 1 spent 15 tokens, its grading 1050: past the budget, so no turn 2 is begun.
    assert (record.outcome, record.outcome_iterations, record.turns) == ("unsatisfied", 1, 1)
    assert record.last_error is not None and "max_tokens" in record.last_error
    assert record.input_tokens + record.output_tokens == 15 + 1050
    assert record.budget_exceeded is not None
    assert not world.client.exists(world.keys.inbox(run_id))


def test_a_grader_without_a_verdict_is_reported_and_not_sent(world: World) -> None:
    accept_at(world, "prose")
    run_id = world.run(outcome="anything")
    drive(world, run_id, "try")
    record = world.store.record(run_id)
    assert (record.outcome, record.outcome_iterations, record.turns) == ("in-progress", 0, 1)
    [(_, evaluation)] = evaluations(world, run_id)
    assert evaluation["satisfied"] is False and "invalid-output" in evaluation["feedback"]
    assert record.last_error is not None and "grader of iteration 1 failed" in record.last_error
    assert world.events(run_id, 1)[-1][1] == "turn-complete"
    assert not world.client.exists(world.keys.inbox(run_id))


def test_a_cut_diff_says_so(world: World, tmp_path: Path) -> None:
    accept_at(world, 1)
    run_id = world.run(outcome="anything")
    drive(world, run_id, "x" * 5000)
    record = world.store.record(run_id)
    assert record.options is not None
    from sandbox.local import LocalSandbox
    from worker.workspace.steps import run_workspace

    work = run_workspace(
        LocalSandbox(tmp_path / "local"), run_id, record.options, world.deps.settings, tenant=None
    )
    cut = grading.workspace_diff(work, 1, max_bytes=1000)
    assert cut.endswith("[... the diff was cut here at 1000 bytes ...]\n")
    assert "the diff was cut" not in grading.workspace_diff(work, 1)


def test_the_options_need_an_outcome_and_stay_in_bounds() -> None:
    from worker.errors import InvalidInput
    from worker.options.spec import parse_options

    assert parse_options(harness="codex", outcome="met", max_iterations=50).max_iterations == 50
    for bad in (
        {"max_iterations": 2},
        {"grader": "codex"},
        {"outcome": "met", "max_iterations": 51},
        {"outcome": "met", "max_iterations": 0},
        {"outcome": "met", "grader": "nope"},
        {"outcome": "  "},
    ):
        with pytest.raises(InvalidInput):
            parse_options(harness="codex", **bad)


def test_the_api_body_and_the_command_line_take_them(tmp_path: Path) -> None:
    from worker.api.schemas import RunCreate
    from worker.cli import outcome as cli_outcome
    from worker.cli.main import build_parser

    body = RunCreate.model_validate(
        {"harness": "codex", "input": "x", "outcome": "met", "max_iterations": 4,
         "grader": "claude-code", "grader_model": "m"}
    )  # fmt: skip
    assert body.model_dump(exclude_none=True)["max_iterations"] == 4
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("all tests pass\n")
    args = build_parser().parse_args(
        ["run", "codex", "go", "--outcome", f"@{rubric}", "--max-iterations", "4",
         "--grader", "claude-code", "--grader-model", "m"]
    )  # fmt: skip
    assert cli_outcome.run_options(args) == {
        "outcome": "all tests pass\n", "max_iterations": 4, "grader": "claude-code",
        "grader_model": "m",
    }  # fmt: skip
