"""Reading a run's stream the way a consumer does: ``XREAD BLOCK``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from adapters.events import TERMINAL_TYPES
from worker.client import StreamEvent

MAX_ID = 18446744073709551615


@dataclass(frozen=True)
class Seen(StreamEvent):
    """A stream entry as this consumer received it; ``ts`` is the publisher's timestamp (unix
    seconds) of the batch the event was sent in."""

    at: float
    """``time.time()`` when this consumer received it."""


def before_turn(turn: int) -> str:
    """The cursor that XREAD needs to return a turn's events from its first."""
    return "0-0" if turn <= 1 else f"{turn - 1}-{MAX_ID}"


def wait_terminal(
    client: redis.Redis,
    key: str,
    turn: int,
    *,
    cursor: str | None = None,
    timeout_s: float = 120.0,
    keep: bool = True,
) -> tuple[float, list[Seen]]:
    """Block until the turn's terminal event; (perf_counter when seen, events seen)."""
    cursor = cursor or before_turn(turn)
    deadline = time.monotonic() + timeout_s
    seen: list[Seen] = []
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise TimeoutError(f"turn {turn} of {key} did not end within {timeout_s:g}s")
        reply = client.xread({key: cursor}, count=10_000, block=min(left_ms, 5000))
        now_perf, now_wall = time.perf_counter(), time.time()
        if not reply:
            continue
        for entry_id, fields in reply[0][1]:
            cursor = entry_id
            kind = fields["type"]
            if keep or kind in TERMINAL_TYPES:
                event = Seen(
                    entry_id, kind, json.loads(fields["data"]), float(fields["ts"]), now_wall
                )
                seen.append(event)
            if kind in TERMINAL_TYPES and int(entry_id.split("-")[0]) == turn:
                return now_perf, seen


def read_turn(client: redis.Redis, key: str, turn: int) -> list[tuple[str, dict[str, str]]]:
    """Every entry of one turn, in stream order (XRANGE in pages)."""
    out: list[tuple[str, dict[str, str]]] = []
    start = f"{turn}-0"
    end = f"{turn}-{MAX_ID}"
    while True:
        page = client.xrange(key, min=start, max=end, count=20_000)
        out.extend(page)
        if len(page) < 20_000:
            return out
        last_turn, last_seq = page[-1][0].split("-")
        start = f"{last_turn}-{int(last_seq) + 1}"


def wait_terminal_quietly(
    client: redis.Redis, key: str, turn: int, *, timeout_s: float = 600.0, poll_s: float = 0.05
) -> float:
    """Wait for the turn's terminal event without reading the stream (a consumer reading
    hundreds of thousands of entries would compete for the CPU being measured): poll the
    stream's last entry. Returns perf_counter when it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = client.xrevrange(key, count=1)
        if last:
            entry_id, fields = last[0]
            if int(entry_id.split("-")[0]) == turn and fields.get("type") in TERMINAL_TYPES:
                return time.perf_counter()
        time.sleep(poll_s)
    raise TimeoutError(f"turn {turn} of {key} did not end within {timeout_s:g}s")
