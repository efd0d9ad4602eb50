"""A turn's answer against its output schema: the worker's check, whatever the harness did.

A harness's own schema option (Claude Code's ``--json-schema``, Codex's ``--output-schema``)
is not trusted to have worked: Claude Code 2.1.328 reports ``success`` with prose when the model
never calls its StructuredOutput tool. So every ``turn-complete`` of a turn with a schema is
checked here before its terminal is written: the JSON value the adapter found apart from the
text (``structured``), else the one in the final text (the whole text, a fenced ``json``
block, or the outermost object or array in it), validated with ``jsonschema``. A value that
validates becomes ``structured``; anything else ends the turn with ``session-error`` reason
``invalid-output`` naming the first violation, never a ``turn-complete`` without one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from adapters.events import Event, TurnComplete, session_error

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n\s*```", re.DOTALL | re.IGNORECASE)
_NO_VALUE = object()
EXCERPT_CHARS = 200


def candidate(text: str) -> Any:
    """The JSON value in an answer's text, or ``_NO_VALUE``."""
    texts = [text.strip(), *(m.group(1) for m in _FENCE.finditer(text))]
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            texts.append(text[start : end + 1])
    for piece in texts:
        try:
            return json.loads(piece)
        except ValueError:
            continue
    return _NO_VALUE


def check(terminal: Event, schema: Mapping[str, Any] | None) -> Event:
    """``terminal`` with its ``structured`` value, or the ``invalid-output`` error in its
    place. Anything but a ``turn-complete``, or a turn without a schema, is left as it is."""
    if schema is None or not isinstance(terminal, TurnComplete):
        return terminal
    value = terminal.structured
    if value is None:
        value = candidate(terminal.text)
    excerpt = terminal.text.strip()[:EXCERPT_CHARS]
    if value is _NO_VALUE:
        return session_error(
            f"the answer holds no JSON value, and the turn's output schema asks for one "
            f"(the answer begins: {excerpt!r})",
            "invalid-output",
            exit_code=terminal.exit_code,
        )
    validator = jsonschema.validators.validator_for(schema)(schema)
    violation = best_match(validator.iter_errors(value))
    if violation is not None:
        where = "/" + "/".join(str(p) for p in violation.absolute_path)
        return session_error(
            f"the answer does not match the turn's output schema: {violation.message} "
            f"(at {where if where != '/' else 'the top level'}; the answer begins: {excerpt!r})",
            "invalid-output",
            exit_code=terminal.exit_code,
        )
    return terminal.model_copy(update={"structured": value})
