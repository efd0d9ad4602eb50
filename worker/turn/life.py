"""The life of one turn on the worker that claimed it, owned in one place: its claim, its
owner heartbeat, the run's credential, its patience with Redis, and its one end (through
:func:`worker.store.terminal.write_terminal`, the one writer of every terminal).

The owner heartbeat beats from the claim to the release whatever the turn is doing
(seeding, waiting for a rewind or a slot, preparing, running, snapshotting): one thread per
process refreshes every owner key it holds (:class:`Heartbeats`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from adapters.events import Event, SessionError, session_error
from worker.deps import TurnDeps
from worker.observe.masking import Masker
from worker.store import credentials, lua
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import RedisClient
from worker.store.publisher import RedisStreamPublisher
from worker.store.records import RecordChanges, RunRecord
from worker.store.status import RunStatus
from worker.store.terminal import (
    NO_USAGE,
    Patience,
    TurnRef,
    Usage,
    outcome_label,
    write_terminal,
)

log = logging.getLogger(__name__)

_in_flight: set[tuple[str, str, int]] = set()
"""Turns this process holds. A second delivery of the same message to the same process
carries the same token as the first, so only this tells it from a retry of a lost claim."""
_in_flight_lock = threading.Lock()


class Heartbeats:
    """The owner heartbeats of every turn this process holds, refreshed by one thread: each
    owner key is set again every third of its TTL, whatever its turn is doing. A Redis error
    is ignored (the next beat tries again; the turn's events wait in its publisher)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str, int], tuple[RedisClient, str, str, int]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(
        self, slot: tuple[str, str, int], client: RedisClient, key: str, value: str, ttl_s: int
    ) -> None:
        with self._lock:
            self._held[slot] = (client, key, value, ttl_s)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._beat_forever, name="turn-heartbeats", daemon=True
                )
                self._thread.start()
        self._changed.set()

    def drop(self, slot: tuple[str, str, int]) -> None:
        with self._lock:
            self._held.pop(slot, None)

    def holds(self, slot: tuple[str, str, int]) -> bool:
        with self._lock:
            return slot in self._held

    def _beat_forever(self) -> None:
        # A new hold only wakes the thread to recompute its interval: its claim has just set
        # the owner key with a full TTL, so the next beat is due one interval after the last.
        last = time.monotonic()
        while True:
            with self._lock:
                held = list(self._held.values())
            interval = max(min((ttl / 3 for *_, ttl in held), default=1.0), 0.2)
            due = last + interval
            self._changed.wait(max(due - time.monotonic(), 0.0))
            self._changed.clear()
            if time.monotonic() < due:
                continue
            with self._lock:
                held = list(self._held.values())
            self.beat(held)
            last = time.monotonic()

    @staticmethod
    def beat(held: list[tuple[RedisClient, str, str, int]]) -> None:
        by_client: dict[int, list[tuple[RedisClient, str, str, int]]] = {}
        for entry in held:
            by_client.setdefault(id(entry[0]), []).append(entry)
        for entries in by_client.values():
            pipe = entries[0][0].pipeline(transaction=False)
            for _, key, value, ttl in entries:
                pipe.set(key, value, ex=ttl, xx=True)  # never again after a release
            try:
                pipe.execute()
            except REDIS_ERRORS:
                log.debug("turn.heartbeat_failed", extra={"keys": len(entries)})


HEARTBEATS = Heartbeats()


class TurnLife:
    """A turn taken by this worker: claimed, heartbeating from its claim to its release,
    holding the run's credential, and ended exactly once through :meth:`end`."""

    def __init__(
        self,
        deps: TurnDeps,
        run_id: str,
        turn: int,
        harness: str,
        record: RunRecord | None = None,
    ) -> None:
        self.deps = deps
        self.ref = TurnRef(
            deps.redis, deps.keys, deps.store, deps.settings, run_id, turn, harness, record
        )
        self.patience = Patience()
        self.publisher: RedisStreamPublisher | None = None
        """The turn's publisher once it has published its ``turn-started``."""
        self.usage: Callable[[], Usage] = lambda: NO_USAGE
        self.changes = RecordChanges()
        """Facts of the turn its end writes into the record with its terminal, on any path."""
        self._owner_key = deps.keys.turn_owner(run_id, turn)
        self._token = ""
        self.ended = False

    # -- claim and heartbeat ---------------------------------------------------------------

    def claim(self, delivery: str | None) -> bool:
        """Take the turn; its heartbeat beats from now until :meth:`release`. False when
        another delivery took it first. Redis errors propagate: nothing has happened yet, so
        the delivery may simply be tried again."""
        deps, ref = self.deps, self.ref
        with _in_flight_lock:
            if self._slot in _in_flight:
                return False
            _in_flight.add(self._slot)
        claimed = False
        token = f"{deps.worker_id}/{delivery or uuid.uuid4().hex}"
        try:
            claimed = lua.scripts(deps.redis).claim_turn(
                (
                    deps.keys.turn_started(ref.run_id, ref.turn),
                    self._owner_key,
                    deps.keys.events(ref.run_id),
                    deps.keys.run(ref.run_id),
                ),
                ref.turn,
                token,
                deps.settings.retention_s + deps.settings.run_lease_s,
                deps.settings.heartbeat_ttl_s,
            )
        finally:
            if not claimed:
                with _in_flight_lock:
                    _in_flight.discard(self._slot)
        if claimed:
            self._token = token
            HEARTBEATS.hold(
                self._slot, deps.redis, self._owner_key, token, deps.settings.heartbeat_ttl_s
            )
        return claimed

    @property
    def _slot(self) -> tuple[str, str, int]:
        return (self.deps.keys.prefix, self.ref.run_id, self.ref.turn)

    def stop_check(self) -> Callable[[], SessionError | None]:
        """What the read loop asks every poll: stop for shutdown or cancel?"""
        deps, ref = self.deps, self.ref
        cancel_key = deps.keys.cancel(ref.run_id, ref.turn)

        def check() -> SessionError | None:
            if deps.shutdown.expired():
                return session_error("the worker is shutting down", "shutdown")
            try:
                if deps.redis.exists(cancel_key):
                    return session_error("the turn was cancelled", "cancelled")
            except REDIS_ERRORS:
                pass
            return None

        return check

    def release(self) -> None:
        """The turn is over on this worker: stop its heartbeat and drop the owner key."""
        HEARTBEATS.drop(self._slot)
        with _in_flight_lock:
            _in_flight.discard(self._slot)
        try:
            self.patience.call(lambda: self.deps.redis.delete(self._owner_key))
        except REDIS_ERRORS:
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
        merged = RecordChanges()
        merged.update(self.changes)
        merged.update(changes or {})
        write_terminal(
            self.ref,
            terminal,
            run_status=run_status,
            caller=f"owner:{self._token}",
            publisher=self.publisher,
            usage=self.usage(),
            changes=merged,
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
