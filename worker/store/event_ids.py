"""A run stream's event id, ``{turn}-{seq}``: the one parser of an id a caller hands us.

An event id is the Redis stream entry id (docs/events.md), so both parts are what Redis
takes: whole numbers from 0 to 2**64 - 1. Every id that comes from outside (the API's
``Last-Event-ID`` and ``?after=``, the client's ``events(after=)``, ``harness events
--after``) goes through :func:`parse_event_id` before it reaches Redis: an id Redis would
refuse (``1-99999999999999999999``) is refused here, as the caller's mistake, and never
becomes a Redis error in a reader that other streams share.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from worker.errors import InvalidInput

FIRST_ID = "1-0"
"""The run's first event: the only one whose XADD may create the run's stream (a stream that
is gone later went with its run; worker/store/publisher.py)."""
PART_MAX = 2**64 - 1
"""Redis's bound on each part of a stream entry id (an unsigned 64-bit integer)."""
_FORM = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")  # ASCII digits only: no signs, no spaces


class EventId(NamedTuple):
    """An event id as numbers; ordered as the stream orders its entries."""

    turn: int
    seq: int

    def __str__(self) -> str:
        return f"{self.turn}-{self.seq}"


START = EventId(0, 0)
"""Before every event: a stream read after it starts at the first entry."""
LAST = EventId(PART_MAX, PART_MAX)
"""Nothing comes after it (Redis refuses it as the exclusive start of a range)."""


def parse_event_id(text: str) -> EventId:
    """The id ``text`` names; InvalidInput (the text cut, and what an id looks like) when it
    is no ``TURN-SEQ`` of two whole numbers within Redis's range."""
    match = _FORM.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        turn, seq = int(match[1]), int(match[2])
        if turn <= PART_MAX and seq <= PART_MAX:
            return EventId(turn, seq)
    raise InvalidInput(
        f"invalid event id {str(text)[:48]!r}: expected TURN-SEQ, two whole numbers of at most "
        f"{PART_MAX}, like 3-0"
    )
