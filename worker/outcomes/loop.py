"""After a graded turn: judge it, publish the evaluation, and decide what comes next.

Called by the turn (worker/turn/execute.py) for a ``turn-complete`` of a run whose outcome
is ``in-progress``, before its terminal event, so the evaluation is an event of that turn and
the grader's spend is in its totals (a ``usage`` of source ``grader``) and its budget:

- satisfied: ``outcome: satisfied``;
- not satisfied, ``max_iterations`` graded: ``outcome: max-iterations``;
- not satisfied, the budget refuses another turn (the grader's spend counted):
  ``outcome: unsatisfied``, ``last_error`` says which limit;
- not satisfied otherwise: the feedback waits in the run's inbox as a ``queue`` message by
  ``grader:GRADER_RUN_ID``; the turn's end delivers it (worker/control/delivery.py) as the
  next turn, whose ``user-message`` shows it;
- the grader failed: an evaluation with ``satisfied: false`` and why, sent to no one (the
  agent did not fail): ``outcome`` stays ``in-progress``, ``last_error`` says so, the
  iteration is not counted, and the next turn sent to the run is graded again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from adapters.events import Event, OutcomeEvaluation, Usage
from worker.control.messages import Message, to_inbox
from worker.deps import TurnDeps
from worker.outcomes import grader
from worker.outcomes.grader import RunTurn, Verdict
from worker.spend.budgets import Over
from worker.store.records import RecordChanges, RunRecord
from worker.workspace.steps import RunWorkspace

log = logging.getLogger(__name__)

DEFAULT_MAX_ITERATIONS = 3
NO_FEEDBACK = "The outcome is not met yet (the grader gave no feedback): check it and go on."


def graded(record: RunRecord) -> bool:
    """Whether this run's completed turns are graded now."""
    options = record.options
    return bool(options and options.outcome) and record.outcome in (None, "in-progress")


@dataclass(frozen=True)
class GradedTurn:
    """The turn being graded, and how it publishes (``send``: before its terminal)."""

    deps: TurnDeps
    record: RunRecord
    turn: int
    answer: str
    work: RunWorkspace
    send: Callable[[list[Event]], None]
    mask: Callable[[str], str]
    next_turn_refused: Callable[[], Over | None]
    """Why the budget refuses another turn, the grader's spend counted (None: it does not)."""


def evaluate(graded_turn: GradedTurn, *, run_turn: RunTurn) -> RecordChanges:
    """Grade the turn, publish what the grader said and spent; the record's changes."""
    deps, record, turn = graded_turn.deps, graded_turn.record, graded_turn.turn
    options = record.options
    assert options is not None and options.outcome is not None
    iteration = record.outcome_iterations + 1
    text = grader.grader_input(
        options.outcome, graded_turn.answer, grader.workspace_diff(graded_turn.work, turn)
    )
    try:
        verdict = grader.grade(deps, record, options, text, run_turn=run_turn, end_run=deps.end_run)
    except Exception as exc:  # the graded turn did finish: a grader's trouble is not its failure
        log.exception("outcome.grader_error", extra={"run_id": record.run_id})
        why = f"the grader could not run: {type(exc).__name__}"
        verdict = Verdict(False, why, None, error=True)
    mask = graded_turn.mask
    feedback = mask(verdict.feedback)
    events: list[Event] = []
    if verdict.spent:
        events.append(
            Usage(
                input_tokens=verdict.input_tokens,
                output_tokens=verdict.output_tokens,
                cached_input_tokens=verdict.cached_input_tokens,
                cost_usd=verdict.cost_usd,
                source="grader",
            )
        )
    events.append(_event(iteration, verdict, feedback))
    graded_turn.send(events)  # the usage first: the budget's check below counts it
    log.info(
        "outcome.evaluated",
        extra={"run_id": record.run_id, "iteration": iteration, "satisfied": verdict.satisfied,
               "grader": verdict.grader_run_id, "error": verdict.error},
    )  # fmt: skip
    if verdict.error:
        return RecordChanges(
            outcome="in-progress",
            last_error=(
                f"outcome: the grader of iteration {iteration} failed ({feedback}); "
                "the next turn sent to the run is graded again"
            )[:500],
        )
    changes = RecordChanges(outcome_iterations=iteration)
    limit = options.max_iterations or DEFAULT_MAX_ITERATIONS
    if verdict.satisfied:
        changes["outcome"] = "satisfied"
    elif iteration >= limit:
        changes["outcome"] = "max-iterations"
    else:
        over = graded_turn.next_turn_refused()
        if over is not None:
            changes["outcome"] = "unsatisfied"
            changes["last_error"] = over.error("for the outcome's next iteration").error.replace(
                "RUN_ID", record.run_id
            )[:500]
        else:
            changes["outcome"] = "in-progress"
            by = f"grader:{verdict.grader_run_id}"
            message = Message.new(feedback or NO_FEEDBACK, "queue", by)
            ttl_s = int(deps.settings.retention_s + deps.settings.run_lease_s)
            to_inbox(deps.redis, deps.keys, record.run_id, [message], ttl_s)
    return changes


def _event(iteration: int, verdict: Verdict, feedback: str) -> OutcomeEvaluation:
    return OutcomeEvaluation(
        iteration=iteration,
        satisfied=verdict.satisfied,
        feedback=feedback,
        grader_run_id=verdict.grader_run_id,
        input_tokens=verdict.input_tokens,
        output_tokens=verdict.output_tokens,
        cost_usd=verdict.cost_usd,
    )
