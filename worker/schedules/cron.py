"""Cron expressions and time zones: checked once when a schedule is added, and each fire
time computed from them (``croniter``, with zoneinfo: DST-correct wall-clock times).

Five fields (minute to day of week), or six with seconds first (``*/5 * * * * *``)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from worker.errors import InvalidInput

MAX_EXPR_CHARS = 200


def _seconds_first(expr: str) -> bool:
    return len(expr.split()) == 6


def zone(tz: str | None) -> ZoneInfo:
    """The time zone named ``tz`` (an IANA name; None: UTC), or InvalidInput."""
    name = tz or "UTC"
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(
            f"unknown time zone {name[:80]!r}: an IANA name such as "
            f"Europe/Berlin ({exc.__class__.__name__})"
        ) from None


def check(expr: str, tz: str | None) -> None:
    """InvalidInput unless ``expr`` is a cron expression of 5 fields, or 6 with seconds
    first, and ``tz`` a known time zone."""
    zone(tz)
    fields = expr.split() if isinstance(expr, str) else []
    if len(expr) > MAX_EXPR_CHARS or len(fields) not in (5, 6):
        raise InvalidInput(
            f"invalid cron expression {str(expr)[:80]!r}: 5 fields (minute hour day month "
            "weekday), or 6 with seconds first"
        )
    if not croniter.is_valid(expr, second_at_beginning=_seconds_first(expr)):
        raise InvalidInput(f"invalid cron expression {expr[:80]!r}")


def next_after(expr: str, tz: str | None, after: float) -> int:
    """The first fire time strictly after ``after`` (epoch seconds), as epoch seconds.

    A wall-clock time that happens twice (the hour repeated when DST ends) fires once, at
    its first occurrence, unless the hour field is ``*`` (then every tick of both hours)."""
    where = zone(tz)
    seconds_first = _seconds_first(expr)
    fixed_hour = expr.split()[2 if seconds_first else 1] != "*"
    start = datetime.fromtimestamp(after, UTC).astimezone(where)
    ticks = croniter(expr, start, second_at_beginning=seconds_first)
    while True:
        found = int(ticks.get_next(datetime).timestamp())
        if not (fixed_hour and datetime.fromtimestamp(found, where).fold == 1):
            return found
