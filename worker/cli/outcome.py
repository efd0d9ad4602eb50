"""``harness run``'s outcome options: ``--outcome RUBRIC`` graded after each completed turn
until met (docs/events.md, "Outcomes: graded until met")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from adapters import HARNESS_IDS
from worker.errors import InvalidInput
from worker.options.spec import MAX_ITERATIONS, OUTCOME_MAX_CHARS


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--outcome",
        metavar="RUBRIC",
        help="what the run's result must meet, or @FILE to read it from a file: after each "
        "completed turn a grader (a run of its own) judges the result against it, and its "
        "feedback is the next turn's input until it is met or --max-iterations",
    )
    run.add_argument(
        "--max-iterations",
        type=int,
        metavar="N",
        help=f"the most turns graded against --outcome (1 to {MAX_ITERATIONS}; default 3)",
    )
    run.add_argument(
        "--grader",
        choices=HARNESS_IDS,
        metavar="HARNESS",
        help="the grader's harness (default: the run's own)",
    )
    run.add_argument(
        "--grader-model",
        metavar="MODEL",
        help="the grader's model (default: the run's own, with the run's harness)",
    )


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "outcome": rubric(args.outcome),
        "max_iterations": args.max_iterations,
        "grader": args.grader,
        "grader_model": args.grader_model,
    }


def rubric(value: str | None) -> str | None:
    """The rubric as given, or the text of ``@FILE`` (UTF-8, within the rubric's bound)."""
    if not value or not value.startswith("@"):
        return value
    path = Path(value[1:])
    try:
        data = path.read_bytes()[: OUTCOME_MAX_CHARS * 4 + 1]
    except OSError as exc:
        raise InvalidInput(f"cannot read the outcome file {str(path)!r}: {exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the outcome file {str(path)!r} is not UTF-8 text") from exc
