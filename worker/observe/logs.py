"""Structured logs: one line per step, stable dotted event names, context as fields.

Code logs ``log.info("turn.started", extra={...})``; this module turns every record into one
line: JSON when stderr is not a terminal (or HARNESS_LOG_FORMAT=json), ``key=value`` text
on a terminal (or HARNESS_LOG_FORMAT=text). A JSON line holds ``ts``, ``level``, ``event``
(the message), the fields of the current turn context (``run_id``, ``turn``, ``harness``),
the record's ``extra`` fields, ``logger``, and ``exc`` for a traceback. Celery's own records
go through the same formatter.

The turn context is a context variable set around each task (worker/tasks.py) and filled as
the turn learns more (worker/turn/execute.py), so every record logged while a turn runs (the
sandbox's included) carries its run id, turn and harness. The secret values granted to a
turn are registered in that context and masked out of every line logged within it, as a
last line of defence: nothing should log them in the first place.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from worker.observe.masking import Masker

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "harness_log_context", default=None
)
_MASKER = "_masker"

#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()
    | {"message", "asctime", "taskName", "color", "data"}
)
_FIRST = ("run_id", "turn", "harness")


@contextlib.contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Fields added to every record logged in this block (this thread or task)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add fields to the current context (no effect outside one)."""
    current = _context.get()
    if current is not None:
        current.update(fields)


def mask(secrets: Mapping[str, str]) -> None:
    """Mask these values in every line logged in the current context."""
    bind(**{_MASKER: Masker(secrets)})


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured content of a record: context, extras, event, level, logger."""
    current = _context.get() or {}
    out: dict[str, Any] = {
        "ts": _iso(record.created),
        "level": record.levelname.lower(),
        "event": record.getMessage(),
    }
    extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    merged = {k: v for k, v in current.items() if not k.startswith("_")} | extras
    for key in _FIRST:
        if key in merged:
            out[key] = merged.pop(key)
    out.update(merged)
    out["logger"] = record.name
    return out


def _iso(created: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        + f".{int(created % 1 * 1000):03d}Z"
    )


def _masked(line: str) -> str:
    masker = (_context.get() or {}).get(_MASKER)
    return masker.mask(line) if masker else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out = fields(record)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = record.stack_info
        return _masked(json.dumps(out, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level event key=value ...`` for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        out = fields(record)
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        head = f"{clock} {out.pop('level'):<7} {out.pop('event')}"
        out.pop("ts")
        out.pop("logger")
        pairs = " ".join(f"{k}={_value(v)}" for k, v in out.items())
        line = f"{head}  {pairs}" if pairs else head
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return _masked(line)


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if not text or any(c in text for c in ' ="\n') else text


def _record_less() -> None:
    """No line names its caller's file, line, thread or process, so a record need not look
    them up (the logging HOWTO's "Optimization"): a stack walk and three lookups less for
    each of a turn's eight lines, ~4 us each here."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def use_json(log_format: str, stream: TextIO) -> bool:
    if log_format == "json":
        return True
    if log_format == "text":
        return False
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def configure(
    log_format: str = "auto", level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Send every record (ours and Celery's) to ``stream`` (stderr) in the chosen format."""
    stream = stream or sys.stderr
    _record_less()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if use_json(log_format, stream) else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
