"""``--attach FILE`` and ``--output-schema FILE``, on ``run`` and on ``turn``: files carried
into a turn, and the JSON Schema its answer must meet."""

from __future__ import annotations

import argparse
from typing import Any

from worker.options.output_schema import load_output_schema
from worker.options.spec import SCHEMA_HARD_MAX_BYTES


def add_options(parser: argparse.ArgumentParser, bound: str, *, turn: bool = False) -> None:
    parser.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="a file for the turn (repeatable): images (PNG, JPEG, GIF, WebP, known by their "
        "bytes) through the harness's own image input where it has one, every file in the "
        f"workspace at .attachments/turn-N/NAME and named in the input; size and count {bound}",
    )
    which = "this turn's answer (in place of the run's)" if turn else "every turn's answer"
    parser.add_argument(
        "--output-schema",
        metavar="FILE",
        help=f"a JSON Schema {which} must meet: validated by the worker, turn-complete then "
        "carries it as structured; an answer that does not is a session-error invalid-output",
    )


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The client's ``attachments`` and ``output_schema`` from the arguments."""
    return {
        "attachments": list(args.attach) or None,
        "output_schema": schema(args.output_schema),
    }


def schema(path: str | None) -> dict[str, Any] | None:
    return None if path is None else load_output_schema(path, SCHEMA_HARD_MAX_BYTES)
