"""The one writer of a turn's terminal event, for every path that ends a turn: completed,
refused, cancelled in the queue, cancelled by a client, lost with its worker, waited too long
for its host, an internal error of the worker before or after the claim, shutdown.

It is one script (``end_turn.lua``) that checks the caller may end the turn and that the
turn has no terminal yet, then writes the terminal entry (``turn-started`` first when the
turn has no event) and the record together: a consumer who sees the end of a turn finds the
record updated, and two enders racing (a cancel and a claim, a reaper and a slow owner)
leave one terminal that the record agrees with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from adapters.events import Event, SessionError, TurnStarted
from config import Settings
from worker.observe import metrics
from worker.observe.masking import Masker
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, RedisClient
from worker.store.publisher import RedisStreamPublisher
from worker.store.records import RecordChanges, RunRecord, RunStore
from worker.store.status import RunStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

REDIS_PATIENCE_S = 600.0
"""How long, in all, one turn may wait for Redis before it gives up."""

Usage = tuple[int, int, int, float | None]
NO_USAGE: Usage = (0, 0, 0, None)


class Patience:
    """One budget of waiting for Redis per turn, shared by every call of the turn: an outage
    is ridden out once, up to :data:`REDIS_PATIENCE_S` in all, never once per call."""

    def __init__(self, budget_s: float = REDIS_PATIENCE_S) -> None:
        self.left = budget_s

    def call(self, fn: Callable[[], T]) -> T:
        while True:
            began = time.monotonic()
            try:
                return fn()
            except REDIS_ERRORS:
                if self.left <= 0:
                    raise
                time.sleep(min(0.5, max(self.left, 0.0)))
                self.left -= time.monotonic() - began


@dataclass(frozen=True)
class TurnRef:
    """One turn of one run, and where its record and stream live."""

    redis: RedisClient
    keys: Keys
    store: RunStore
    settings: Settings
    run_id: str
    turn: int
    harness: str
    record: RunRecord | None = None
    """The run's record as the turn read it, when it did: its listing identity (tenant,
    harness, labels), which never changes, saves a read when the turn's end renews the
    run's keys."""


Caller = str
"""Who ends a turn, as ``end_turn.lua`` checks it: ``owner:TOKEN`` (the worker holding its
claim), ``unclaimed`` (no worker took it), ``lost`` (its worker's heartbeat is gone), or
``outsider`` (either of the last two)."""


def write_terminal(
    ref: TurnRef,
    terminal: Event,
    *,
    run_status: RunStatus,
    caller: Caller,
    publisher: RedisStreamPublisher | None = None,
    usage: Usage = NO_USAGE,
    changes: RecordChanges | None = None,
    transcript: tuple[str, str] | None = None,
    patience: Patience | None = None,
) -> bool:
    """The one writer of a turn's terminal event. False when ``caller`` may not end the turn
    or it already had its terminal (nothing is written then).

    ``publisher`` is the turn's own when a harness ran: what it still holds is sent first,
    so that the terminal comes last.
    """
    patience = patience or Patience()
    masker = Masker()
    if publisher is not None:
        masker = publisher.masker
        if not publisher.drain(max(patience.left, 1.0)):
            log.error(
                "stream.lost",
                extra={"run_id": ref.run_id, "turn": ref.turn, "pending": publisher.pending},
            )
    record = changes.copy() if changes else RecordChanges()
    if isinstance(terminal, SessionError):
        record.setdefault("last_error", masker.mask(f"{terminal.reason}: {terminal.error}"))
    header = TurnStarted(harness=ref.harness, attempt=1, input_chars=0).data_json()
    entry = (terminal.type, masker.mask(terminal.data_json()))
    settings = ref.settings
    tries = 0

    def end() -> tuple[bool, str]:
        nonlocal tries
        tries += 1
        return ref.store.end_turn(
            ref.run_id,
            ref.turn,
            caller=caller,
            status=run_status,
            header=header,
            terminal=entry,
            usage=usage,
            changes=record,
            maxlen=settings.stream_maxlen,
            mark_ttl_s=settings.retention_s + settings.run_lease_s,
        )

    done, detail = patience.call(end)
    if not done and not (detail == "ended" and tries > 1 and _is_last(ref, entry)):
        log.info(
            "turn.end_refused",
            extra={"run_id": ref.run_id, "turn": ref.turn, "why": detail, "caller": caller},
        )
        return False
    metrics.events_published([terminal.type])
    if transcript is not None:
        said, answered = transcript
        patience.call(lambda: ref.store.append_transcript(ref.run_id, ref.turn, said, answered))
    # A failed run keeps nothing to come back to; any other keeps its record past its lease.
    keep_s = settings.retention_s + (0 if run_status == "failed" else settings.run_lease_s)
    patience.call(lambda: ref.store.expire(ref.run_id, keep_s, ref.record))
    return True


def _is_last(ref: TurnRef, entry: tuple[str, str]) -> bool:
    """Whether the turn's last entry is this terminal: an earlier try of ours wrote it and
    its reply was lost."""
    found = ref.redis.xrevrange(
        ref.keys.events(ref.run_id),
        max=f"{ref.turn}-18446744073709551615",
        min=f"{ref.turn}-0",
        count=1,
    )
    if not found:
        return False
    fields = found[0][1]
    return bool(fields.get("type") == entry[0] and fields.get("data") == entry[1])


def outcome_label(terminal: Event) -> str:
    return "completed" if not isinstance(terminal, SessionError) else f"failed:{terminal.reason}"


def end_unclaimed_turn(
    ref: TurnRef,
    error: SessionError,
    *,
    caller: Caller = "outsider",
    run_status: RunStatus = "idle",
    patience_s: float = 30.0,
) -> bool:
    """End a turn no harness will finish and no live worker holds (lost with its worker,
    waited too long for its host, cancelled in the queue). False when ``caller`` may not end
    it (a worker holds it) or it had already ended."""
    written = write_terminal(
        ref, error, run_status=run_status, caller=caller, patience=Patience(patience_s)
    )
    if written:
        log.warning(
            "turn.ended_without_harness",
            extra={"run_id": ref.run_id, "turn": ref.turn, "reason": error.reason},
        )
    return written
