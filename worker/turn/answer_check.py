"""The check of one answer against its output schema, as a process of its own.

``worker.turn.structured`` runs ``python -m worker.turn.answer_check SECONDS`` with the
request on stdin, ``{"schema", "structured", "text"}``, and reads one verdict on stdout:

- ``{"verdict": "valid", "value": V}``: ``V`` (``structured``, else the JSON value found
  in ``text``) meets the schema;
- ``{"verdict": "none"}``: no JSON value to check;
- ``{"verdict": "mismatch", "message": M, "at": POINTER}``: the first violation;
- ``{"verdict": "unchecked", "why": W}``: the check could not be made (too deep, too big).

Both the schema and the text are a producer's and a model's: a check may cost whatever they
make it cost. Here that cost is bounded by the kernel (a CPU-time and an address-space
limit this process sets on itself first) and by the parent (which kills it after
``SECONDS``), and no thread of the worker waits on a lock it holds. Imports are kept to
what the check needs: every check starts a Python.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from typing import Any

from jsonschema.exceptions import best_match

from worker.options.schema_regex import compile_pattern
from worker.options.schema_validator import validator

MEMORY_BYTES = 1 << 30
"""The address space a check may take: an 8 MiB answer as Python objects is well within it."""
MESSAGE_CHARS = 1000
"""A violation's message quotes the value: at most this much of it goes back."""
_FENCE = compile_pattern(r"(?is)```(?:json)?\s*\n(.*?)\n\s*```")
# A byte-level RE2 pattern: ``.*?`` of Python's ``re`` rescanned the whole text from each
# opening fence that has no closing one (minutes for a 400 KB answer of "```\nx").
_NO_VALUE = object()
TOO_DEEP = "the answer (or the schema's references) nest too deep to check"


def candidate(text: str) -> Any:
    """The JSON value in an answer's text (the whole text, a fenced ``json`` block, or the
    outermost object or array in it), or ``_NO_VALUE``."""
    data = text.encode("utf-8", "surrogatepass")
    fenced = [m.group(1) for m in _FENCE.finditer(data)]
    texts: list[str | bytes] = [text.strip(), *fenced]
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            texts.append(text[start : end + 1])
    for piece in texts:
        try:
            return json.loads(piece)
        except (ValueError, RecursionError):
            continue
    return _NO_VALUE


def verdict(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one request (the module docstring)."""
    value = request.get("structured")
    if value is None:
        value = candidate(request.get("text") or "")
    if value is _NO_VALUE:
        return {"verdict": "none"}
    checker = validator(request["schema"])
    try:
        violation = best_match(checker.iter_errors(value))
    except RecursionError:
        return {"verdict": "unchecked", "why": TOO_DEEP}
    if violation is None:
        return {"verdict": "valid", "value": value}
    where = "/" + "/".join(str(p) for p in violation.absolute_path)
    message = violation.message
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return {"verdict": "mismatch", "message": message, "at": where}


def _bound(seconds: float) -> None:
    cpu = math.ceil(seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    os.nice(5)  # the worker's own threads first


def main() -> int:
    _bound(float(sys.argv[1]))
    try:
        request = json.loads(sys.stdin.buffer.read())
        answer = verdict(request)
    except MemoryError:
        answer = {"verdict": "unchecked", "why": f"it needs over {MEMORY_BYTES >> 20} MiB"}
    except RecursionError:
        answer = {"verdict": "unchecked", "why": TOO_DEEP}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
