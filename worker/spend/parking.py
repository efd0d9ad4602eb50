"""Parking: a turn that meets a rate limit or a quota is sent again at the reset.

When a turn ends ``rate-limited``, or ``quota`` with a reset time, and its run parks on limits
(``--on-limit park``, the default from ``HARNESS_ON_LIMIT``), the worker does what a patient
producer would: it sends the same input again as the run's next turn, after the reset.

The stream shape (docs/events.md, "Parked runs"): the limited turn N ends as it always did,
with its one terminal ``session-error`` (``rate-limited`` or ``quota``), and just before it a
``parked`` event (``resume_at``, ``reason``, ``next_turn``). Turn N+1 begins at
``resume_at`` with the same input and resumes the vendor session of turn N; it is an
ordinary turn (its own ``turn-started``, its one terminal). So every turn keeps exactly one
terminal event, a consumer that waits for turn N's terminal gets what turn N did, and one
that follows the run sees the retry as the next turn.

Meanwhile the run record says ``status: parked``, ``resume_at`` and ``parks``, and
``current_turn`` is already N+1 (a producer's ``turn`` is refused as busy; ``cancel`` and
``end`` withdraw the parked turn). The turn is sent with a Celery countdown: no process waits
for the reset. Its payload carries ``not_before``, so a copy delivered early (a broker's
redelivery) is sent on again instead of running; and its queued entry is what the reaper
sends again, through the one re-sender of queued turns
(:func:`worker.fleet.lifecycle.resend_queued_turn`), if no worker takes the turn within
HARNESS_RESEND_AFTER_S after the reset (:func:`resend_not_before`), as when the worker
holding the countdown died: the turn survives worker restarts, and is never sent again
before its reset.

Without a reset time, a rate limit parks for an exponential backoff with jitter
(HARNESS_BACKOFF_BASE_S doubled per park, at most HARNESS_BACKOFF_MAX_S, between half and
all of it). A quota without a reset (a spend cap the API reports) is never retried blindly:
the turn just fails. A run parks at most HARNESS_MAX_PARKS times, never for a reset further
than HARNESS_PARK_MAX_S, and never when its budget would refuse the next turn: retries count
against the budget (each is a turn, and its tokens are the run's).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.events import Event, Parked, SessionError
from config import Settings
from worker.deps import TurnDeps
from worker.options.spec import RunOptions, TurnPayload
from worker.store import lua, queued
from worker.store.queued import QueuedTurn
from worker.store.records import RunRecord

log = logging.getLogger(__name__)

LIMITED = frozenset({"rate-limited", "quota"})
EARLY_TOLERANCE_S = 0.05
"""A turn delivered this close to its ``not_before`` runs (clocks of two machines differ)."""

Sender = Callable[[dict[str, Any], str, float], None]
"""Sends a turn's payload to a queue with a countdown in seconds."""


@dataclass(frozen=True)
class Park:
    """A limited turn, parked: its input goes again as ``next_turn`` at ``resume_at``."""

    run_id: str
    turn: int
    next_turn: int
    resume_at: float
    reason: str
    payload: dict[str, Any]
    queue: str

    @property
    def event(self) -> Event:
        return Parked(
            resume_at=self.resume_at,
            reason=self.reason,  # type: ignore[arg-type]
            next_turn=self.next_turn,
        )


def backoff_s(parks: int, settings: Settings, rng: random.Random | None = None) -> float:
    """The wait before the next try of a rate limit without a reset time: the base doubled
    per park so far, capped, with jitter (between half and all of it)."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * (2 ** min(parks, 30)))
    return float(ceiling * (0.5 + 0.5 * (rng or random).random()))


def delay_for(
    terminal: Event,
    options: RunOptions,
    record: RunRecord,
    settings: Settings,
    next_refused: bool = False,
) -> float | None:
    """Seconds until the turn may be tried again, or None when it is not parked."""
    if not isinstance(terminal, SessionError) or terminal.reason not in LIMITED:
        return None
    if (options.on_limit or settings.on_limit) != "park":
        return None
    after = terminal.retry_after_s
    if terminal.reason == "quota" and after is None:
        return None  # a spend cap or an empty wallet: trying again changes nothing
    if record.parks >= settings.max_parks:
        return None
    delay = after if after is not None else backoff_s(record.parks, settings)
    if delay > settings.park_max_s:
        return None
    if next_refused:
        return None  # the retry would be refused: the producer raises the budget first
    return max(0.0, float(delay))


def park(
    deps: TurnDeps,
    payload: TurnPayload,
    options: RunOptions,
    record: RunRecord,
    terminal: Event,
    next_refused: bool = False,
) -> Park | None:
    """Park the run when its turn's terminal says so: the next turn begun, the run
    ``parked`` until the reset, the turn's payload queued for the reaper. Call before the
    turn's terminal is written; :func:`dispatch` after."""
    delay = delay_for(terminal, options, record, deps.settings, next_refused)
    if delay is None:
        return None
    assert isinstance(terminal, SessionError)
    run_id, turn = payload.run_id, payload.turn
    now = time.time()
    resume_at = round(now + delay, 3)
    next_turn = lua.scripts(deps.redis).park_turn(deps.keys.run(run_id), turn, resume_at, now)
    if not next_turn:
        return None  # no longer the run's current turn (cancelled, ended)
    queue = (deps.store.find(run_id) or record).queue or ""
    again = TurnPayload(
        run_id=run_id,
        turn=next_turn,
        input=payload.input,
        not_before=resume_at,
        attachments=payload.attachments,  # uploaded again for it (worker/workspace/attachments)
        output_schema=payload.output_schema,
    ).model_dump()
    QueuedTurn.first(again, queue, resume_at, resume_at=resume_at).write(
        deps.redis, deps.keys, run_id, next_turn, deps.settings.retention_s
    )
    log.info(
        "turn.parked",
        extra={
            "run_id": run_id,
            "turn": turn,
            "next_turn": next_turn,
            "reason": terminal.reason,
            "resume_in_s": round(delay, 3),
        },
    )
    return Park(run_id, turn, next_turn, resume_at, terminal.reason, again, queue)


def dispatch(deps: TurnDeps, parked: Park, send: Sender | None = None) -> None:
    """Send the parked turn with a countdown to its reset (after the limited turn's terminal
    is out: turns of a run never overlap). Should this fail, the reaper sends it."""
    countdown = max(0.0, parked.resume_at - time.time())
    try:
        (send or deps.send_turn)(parked.payload, parked.queue, countdown)
    except Exception:  # the queued entry stays: the reaper sends it later
        log.exception("turn.park_send_failed", extra={"run_id": parked.run_id})


def defer_if_early(deps: TurnDeps, payload: TurnPayload, send: Sender | None = None) -> bool:
    """A parked turn delivered before its reset (a redelivered copy): send it on to run at
    the reset and say so (True); the caller does not take it now."""
    if payload.not_before is None:
        return False
    left = payload.not_before - time.time()
    if left <= EARLY_TOLERANCE_S:
        return False
    entry = queued.read(deps.redis, deps.keys, payload.run_id, payload.turn)
    if entry is None:
        return True  # taken, cancelled or withdrawn meanwhile: nothing to send on
    (send or deps.send_turn)(payload.model_dump(), entry.queue, left)
    log.info("turn.deferred", extra={"run_id": payload.run_id, "turn": payload.turn})
    return True


def resumed(deps: TurnDeps, run_id: str, turn: int) -> bool:
    """The parked run's turn was claimed: the run is ``running`` again."""
    return lua.scripts(deps.redis).resume_turn(deps.keys.run(run_id), turn, time.time())


def resend_not_before(record: RunRecord, settings: Settings) -> float:
    """When the reaper may send a parked turn again (its countdown lost with the worker that
    held it): HARNESS_RESEND_AFTER_S after its reset, never before it (an early copy would
    only be sent on again). The sending is :func:`worker.fleet.lifecycle.resend_queued_turn`."""
    return (record.resume_at or 0.0) + settings.resend_after_s
