"""The life of one turn, owned in one place: its claim, its owner heartbeat, the run's
credential, its patience with Redis, and the one writer of its terminal event.

Every path that ends a turn goes through :func:`write_terminal`: completed, refused,
cancelled in the queue, cancelled by a client, lost with its worker, waited too long for its
host, an internal error of the worker, shutdown. It updates the run record first, then
publishes the terminal event (with ``turn-started`` before it when the turn has no event
yet), so that a consumer who sees the end of a turn finds the record already updated.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

from adapters.events import TERMINAL_TYPES, Event, SessionError, TurnStarted, session_error
from config import Settings
from worker.store import credentials, lua
from worker.store.keys import Keys, RedisClient
from worker.store.publisher import Masker, RedisStreamPublisher, last_seq
from worker.store.records import RecordChanges, RunStatus, RunStore
from worker.turn.deps import TurnDeps

log = logging.getLogger(__name__)

T = TypeVar("T")

REDIS_PATIENCE_S = 600.0
"""How long, in all, one turn may wait for Redis before it gives up."""

Usage = tuple[int, int, int, float | None]
NO_USAGE: Usage = (0, 0, 0, None)

_in_flight: set[tuple[str, str, int]] = set()
"""Turns this process holds. A second delivery of the same message to the same process
carries the same token as the first, so only this tells it from a retry of a lost claim."""
_in_flight_lock = threading.Lock()


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
            except (redis.ConnectionError, redis.TimeoutError):
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


def write_terminal(
    ref: TurnRef,
    terminal: Event,
    *,
    run_status: RunStatus,
    publisher: RedisStreamPublisher | None = None,
    usage: Usage = NO_USAGE,
    changes: RecordChanges | None = None,
    transcript: tuple[str, str] | None = None,
    patience: Patience | None = None,
) -> bool:
    """The one writer of a turn's terminal event. False when the turn already had one.

    ``publisher`` is the turn's own when a harness ran (its events are already out); without
    one the turn's stream is read to continue it, and a turn with no event yet gets its
    ``turn-started`` first.
    """
    patience = patience or Patience()
    events: list[Event] = []
    if publisher is None:
        next_seq, last_type = patience.call(
            lambda: last_seq(ref.redis, ref.keys, ref.run_id, ref.turn)
        )
        if last_type in TERMINAL_TYPES:
            return False
        publisher = RedisStreamPublisher(
            ref.redis,
            ref.keys,
            ref.run_id,
            ref.turn,
            maxlen=ref.settings.stream_maxlen,
            start_seq=next_seq,
        )
        if next_seq == 0:
            events.append(TurnStarted(harness=ref.harness, attempt=1, input_chars=0))
    events.append(terminal)
    record = changes.copy() if changes else RecordChanges()
    if isinstance(terminal, SessionError):
        record.setdefault("last_error", f"{terminal.reason}: {terminal.error}")
    patience.call(
        lambda: ref.store.finish_turn(
            ref.run_id, ref.turn, status=run_status, usage=usage, changes=record
        )
    )
    if transcript is not None:
        said, answered = transcript
        patience.call(lambda: ref.store.append_transcript(ref.run_id, ref.turn, said, answered))
    publisher.publish(events)
    if not publisher.drain(max(patience.left, 1.0)):
        log.error(
            "stream.lost",
            extra={"run_id": ref.run_id, "turn": ref.turn, "pending": publisher.pending},
        )
    settings = ref.settings
    # A failed run keeps nothing to come back to; any other keeps its record past its lease.
    keep_s = settings.retention_s + (0 if run_status == "failed" else settings.run_lease_s)
    patience.call(lambda: ref.store.expire(ref.run_id, keep_s))
    return True


def outcome_label(terminal: Event) -> str:
    return "completed" if not isinstance(terminal, SessionError) else f"failed:{terminal.reason}"


class TurnLife:
    """A turn taken by this worker: claimed, heartbeating, holding the run's credential, and
    ended exactly once through :meth:`end`."""

    def __init__(self, deps: TurnDeps, run_id: str, turn: int, harness: str) -> None:
        self.deps = deps
        self.ref = TurnRef(deps.redis, deps.keys, deps.store, deps.settings, run_id, turn, harness)
        self.patience = Patience()
        self.publisher: RedisStreamPublisher | None = None
        """The turn's publisher once it has published its ``turn-started``."""
        self.usage: Callable[[], Usage] = lambda: NO_USAGE
        self._owner_key = deps.keys.turn_owner(run_id, turn)
        self._last_beat = time.monotonic()
        self.ended = False

    # -- claim and heartbeat ---------------------------------------------------------------

    def claim(self, delivery: str | None) -> bool:
        """Take the turn. False when another delivery took it first. Redis errors propagate:
        nothing has happened yet, so the delivery may simply be tried again."""
        deps, ref = self.deps, self.ref
        with _in_flight_lock:
            if self._slot in _in_flight:
                return False
            _in_flight.add(self._slot)
        claimed = False
        try:
            claimed = lua.scripts(deps.redis).claim_turn(
                deps.keys.turn_started(ref.run_id, ref.turn),
                self._owner_key,
                f"{deps.worker_id}/{delivery or uuid.uuid4().hex}",
                deps.settings.retention_s + deps.settings.run_lease_s,
                deps.settings.heartbeat_ttl_s,
            )
        finally:
            if not claimed:
                with _in_flight_lock:
                    _in_flight.discard(self._slot)
        return claimed

    @property
    def _slot(self) -> tuple[str, str, int]:
        return (self.deps.keys.prefix, self.ref.run_id, self.ref.turn)

    def heartbeat(self) -> None:
        """Refresh the owner key (a third of its TTL at most); a Redis error is ignored, the
        turn goes on and its events wait in the publisher."""
        now = time.monotonic()
        if now - self._last_beat < self.deps.settings.heartbeat_ttl_s / 3:
            return
        try:
            self.deps.redis.set(
                self._owner_key, self.deps.worker_id, ex=self.deps.settings.heartbeat_ttl_s
            )
            self._last_beat = now
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    def stop_check(self) -> Callable[[], SessionError | None]:
        """What the read loop asks every poll: stop for shutdown or cancel? Beats meanwhile."""
        deps, ref = self.deps, self.ref
        cancel_key = deps.keys.cancel(ref.run_id, ref.turn)

        def check() -> SessionError | None:
            if deps.shutdown.expired():
                return session_error("the worker is shutting down", "shutdown")
            try:
                if deps.redis.exists(cancel_key):
                    return session_error("the turn was cancelled", "cancelled")
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            self.heartbeat()
            return None

        return check

    def release(self) -> None:
        """The turn is over on this worker: drop the owner heartbeat."""
        with _in_flight_lock:
            _in_flight.discard(self._slot)
        try:
            self.patience.call(lambda: self.deps.redis.delete(self._owner_key))
        except (redis.ConnectionError, redis.TimeoutError):
            log.warning("turn.release_failed", extra={"run_id": self.ref.run_id})

    # -- the run's credential ---------------------------------------------------------------

    def issue_credential(self) -> str:
        settings = self.deps.settings
        ttl = int(settings.run_lease_s + settings.max_turn_timeout_s)
        return self.patience.call(
            lambda: credentials.issue(self.deps.redis, self.deps.keys, self.ref.run_id, ttl)
        )

    def revoke_credential(self) -> None:
        self.patience.call(
            lambda: credentials.revoke(self.deps.redis, self.deps.keys, self.ref.run_id)
        )

    # -- the end -----------------------------------------------------------------------------

    def end(
        self,
        terminal: Event,
        *,
        run_status: RunStatus,
        changes: RecordChanges | None = None,
        transcript: tuple[str, str] | None = None,
    ) -> str:
        """Record the turn and publish its terminal event, once. Returns the outcome label."""
        if self.ended:
            raise RuntimeError("a turn ends once")
        self.ended = True
        write_terminal(
            self.ref,
            terminal,
            run_status=run_status,
            publisher=self.publisher,
            usage=self.usage(),
            changes=changes,
            transcript=transcript,
            patience=self.patience,
        )
        label = outcome_label(terminal)
        log.info(
            "turn.finished",
            extra={"run_id": self.ref.run_id, "turn": self.ref.turn, "outcome": label},
        )
        return label

    def end_internal(self, exc: BaseException) -> str:
        """An error of the worker itself: the turn ends with reason ``internal`` (the harness,
        if it ran, is already stopped by the read loop's own cleanup)."""
        masker = self.publisher.masker if self.publisher is not None else Masker()
        error = session_error(
            masker.mask(f"internal error of the worker: {type(exc).__name__}: {exc}"),
            "internal",
        )
        return self.end(error, run_status="idle")


def end_unclaimed_turn(
    ref: TurnRef,
    error: SessionError,
    *,
    run_status: RunStatus = "idle",
    patience_s: float = 30.0,
) -> bool:
    """End a turn no harness will finish and no worker holds (lost with its worker, waited
    too long for its host, cancelled in the queue). False when it had already ended."""
    written = write_terminal(ref, error, run_status=run_status, patience=Patience(patience_s))
    if written:
        log.warning(
            "turn.ended_without_harness",
            extra={"run_id": ref.run_id, "turn": ref.turn, "reason": error.reason},
        )
    return written
