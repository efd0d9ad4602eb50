"""Checks and waits the whole suite shares, written once.

- :func:`assert_one_terminal`: the stream rule of one turn (docs/events.md, "Events").
- :func:`wait_for`: poll a condition until it holds or a deadline passes (never a bare
  sleep standing in for "by now it has happened").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

TERMINALS = frozenset({"turn-complete", "session-error"})
T = TypeVar("T")


def _type_and_id(event: Any) -> tuple[str, str | None]:
    """An event as ``(type, entry id or None)``: a client ``StreamEvent``, an adapter
    ``Event`` (no id yet), a JSON dict (``harness ... --json``) or an ``(id, type, data)``
    tuple read straight from Redis."""
    if isinstance(event, dict):
        return event["type"], event.get("id")
    if isinstance(event, tuple):
        return event[1], event[0]
    return event.type, getattr(event, "id", None)


def assert_one_terminal(events: Sequence[T], turn: int | None = None) -> T:
    """One turn's events keep the stream rule: ``turn-started`` first and only once, exactly
    one terminal event and it is the last, and (when the events carry stream ids) ids
    ``{turn}-0``, ``{turn}-1``, ... without a gap. Returns the terminal event."""
    assert events, "no events"
    pairs = [_type_and_id(e) for e in events]
    types = [kind for kind, _ in pairs]
    ids = [entry_id for _, entry_id in pairs]
    assert types[0] == "turn-started" and types.count("turn-started") == 1, types
    assert sum(kind in TERMINALS for kind in types) == 1 and types[-1] in TERMINALS, types
    if all(ids):
        number = turn if turn is not None else int(str(ids[0]).split("-")[0])
        assert ids == [f"{number}-{seq}" for seq in range(len(ids))], ids
    return events[-1]


def wait_for(
    check: Callable[[], T], timeout: float = 20.0, *, interval: float = 0.1, what: str = ""
) -> T:
    """Call ``check`` until it returns something true and return that; fail after
    ``timeout`` seconds saying ``what`` never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what or check}")
        time.sleep(interval)
