"""A turn's answer against its output schema: the worker's check, whatever the harness did.

A harness's own schema option (Claude Code's ``--json-schema``, Codex's ``--output-schema``)
is not trusted to have worked: Claude Code 2.1.328 reports ``success`` with prose when the model
never calls its StructuredOutput tool. So every ``turn-complete`` of a turn with a schema is
checked here before its terminal is written: the JSON value the adapter found apart from the
text (``structured``), else the one in the final text (the whole text, a fenced ``json``
block, or the outermost object or array in it), validated with ``jsonschema``. A value that
validates becomes ``structured``; anything else ends the turn with ``session-error`` reason
``invalid-output`` naming the first violation, never a ``turn-complete`` without one.

The schema is a producer's and the answer a model's, so the check runs in a process of its
own (``worker.turn.answer_check``), with its patterns on RE2, killed after ``CHECK_SECONDS``:
a costly schema or answer costs that turn its check, never another turn of the worker its
thread's share of the GIL. An answer not checked in time is not taken as meeting the schema
(``invalid-output``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters.events import Event, TurnComplete, session_error

log = logging.getLogger(__name__)

CHECK_SECONDS = 10.0
"""How long one answer's check may take: a schema of ordinary size checks an 8 MiB answer
in well under a second; past this the check is killed."""
EXCERPT_CHARS = 200
TOO_DEEP = "the answer (or the schema's references) nest too deep to check"
_ROOT = str(Path(__file__).resolve().parents[2])
"""Where the ``worker`` package is, for the checking process's ``PYTHONPATH``."""


def check(
    terminal: Event, schema: Mapping[str, Any] | None, *, seconds: float = CHECK_SECONDS
) -> Event:
    """``terminal`` with its ``structured`` value, or the ``invalid-output`` error in its
    place. Anything but a ``turn-complete``, or a turn without a schema, is left as it is."""
    if schema is None or not isinstance(terminal, TurnComplete):
        return terminal
    found = _verdict(terminal, schema, seconds)
    excerpt = terminal.text.strip()[:EXCERPT_CHARS]
    if found["verdict"] == "valid":
        return terminal.model_copy(update={"structured": found["value"]})
    if found["verdict"] == "none":
        error = (
            f"the answer holds no JSON value, and the turn's output schema asks for one "
            f"(the answer begins: {excerpt!r})"
        )
    elif found["verdict"] == "mismatch":
        where = found["at"] if found["at"] != "/" else "the top level"
        error = (
            f"the answer does not match the turn's output schema: {found['message']} "
            f"(at {where}; the answer begins: {excerpt!r})"
        )
    else:
        error = (
            f"the answer could not be checked against the turn's output schema: "
            f"{found['why']} (the answer begins: {excerpt!r})"
        )
    return session_error(error, "invalid-output", exit_code=terminal.exit_code)


def _verdict(terminal: TurnComplete, schema: Mapping[str, Any], seconds: float) -> Any:
    try:
        request = json.dumps(
            {"schema": schema, "structured": terminal.structured, "text": terminal.text}
        ).encode()
    except RecursionError:
        return {"verdict": "unchecked", "why": TOO_DEEP}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worker.turn.answer_check", str(seconds)],
            input=request,
            capture_output=True,
            timeout=seconds,
            env={"PYTHONPATH": _ROOT},  # none of the worker's secrets
            check=False,
        )
    except subprocess.TimeoutExpired:
        log.warning("structured.check_timeout", extra={"seconds": seconds})
        return {
            "verdict": "unchecked",
            "why": f"its check took over {seconds:g} s (the schema's patterns or references, "
            "or the answer's size, make it too costly)",
        }
    try:
        return json.loads(done.stdout)
    except ValueError:
        tail = done.stderr.decode("utf-8", "replace")[-2000:]
        log.warning("structured.check_failed", extra={"exit_code": done.returncode, "stderr": tail})
        return {
            "verdict": "unchecked",
            "why": f"its check ended without a verdict (exit status {done.returncode})",
        }
