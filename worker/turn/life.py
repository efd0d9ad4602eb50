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


Slot = tuple[str, str, int]
"""A held turn: (key prefix, run id, turn)."""
Renew = Callable[[], bool]
"""Takes a lapsed hold again if the turn is still its worker's and has not ended."""
Held = tuple[Slot, RedisClient, str, str, int, Renew | None]
"""(slot, client, owner key, token, TTL seconds, renew)."""


class Heartbeats:
    """The owner heartbeats of every turn this process holds, refreshed by one thread: each
    owner key is set again every third of its TTL, whatever its turn is doing. A Redis error
    is ignored (the next beat tries again; the turn's events wait in its publisher).

    Each beat also tells whether the hold still stands. A key the beat finds gone lapsed
    (Redis was away, or the process stalled, for a whole TTL): any worker's reaper may then
    end the turn ``worker-lost``, and the run go on to its next turn. The hold's ``renew``
    takes it again if no reaper has (the turn is still this worker's and has not ended);
    otherwise it is *lost* for good (:meth:`lost`). :meth:`confirmed_at` is when the key was
    last known to be set (the claim, then every beat or renewal that found or set it)."""

    def __init__(self) -> None:
        self._held: dict[Slot, tuple[RedisClient, str, str, int, Renew | None]] = {}
        self._confirmed: dict[Slot, float] = {}
        self._lost: set[Slot] = set()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(
        self,
        slot: Slot,
        client: RedisClient,
        key: str,
        value: str,
        ttl_s: int,
        renew: Renew | None = None,
    ) -> None:
        """Keep ``key`` alive from now on; its claim has just set it (a full TTL). Without
        ``renew``, a key found gone is a lost hold."""
        with self._lock:
            self._held[slot] = (client, key, value, ttl_s, renew)
            self._confirmed[slot] = time.monotonic()
            self._lost.discard(slot)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._beat_forever, name="turn-heartbeats", daemon=True
                )
                self._thread.start()
        self._changed.set()

    def drop(self, slot: Slot) -> None:
        with self._lock:
            self._held.pop(slot, None)
            self._confirmed.pop(slot, None)
            self._lost.discard(slot)

    def holds(self, slot: Slot) -> bool:
        with self._lock:
            return slot in self._held

    def lost(self, slot: Slot) -> bool:
        """Whether this hold's key was found gone and could not be taken again (another
        worker ended the turn): the turn is not ours any more."""
        return slot in self._lost

    def confirmed_at(self, slot: Slot) -> float | None:
        """When (monotonic) this hold's key was last known to be set, if it is held."""
        return self._confirmed.get(slot)

    def record(self, slot: Slot, *, alive: bool) -> bool:
        """What a renewal of the key found: set again (``alive``), or gone. False when the
        hold is lost."""
        with self._lock:
            if slot not in self._held:
                return True  # released meanwhile: its key is gone because the turn ended
            if alive and slot not in self._lost:
                self._confirmed[slot] = time.monotonic()
                return True
            self._lost.add(slot)
            return False

    def _beat_forever(self) -> None:
        # A new hold only wakes the thread to recompute its interval: its claim has just set
        # the owner key with a full TTL, so the next beat is due one interval after the last.
        last = time.monotonic()
        while True:
            with self._lock:
                ttls = [entry[3] for entry in self._held.values()]
            interval = max(min((ttl / 3 for ttl in ttls), default=1.0), 0.2)
            due = last + interval
            self._changed.wait(max(due - time.monotonic(), 0.0))
            self._changed.clear()
            if time.monotonic() < due:
                continue
            with self._lock:
                held = [(slot, *e) for slot, e in self._held.items() if slot not in self._lost]
            self.beat(held)
            last = time.monotonic()

    def beat(self, held: list[Held]) -> None:
        by_client: dict[int, list[Held]] = {}
        for entry in held:
            by_client.setdefault(id(entry[1]), []).append(entry)
        for entries in by_client.values():
            pipe = entries[0][1].pipeline(transaction=False)
            for _, _, key, value, ttl, _ in entries:
                pipe.set(key, value, ex=ttl, xx=True)  # never again after a release
            try:
                results = pipe.execute()
            except REDIS_ERRORS:
                log.debug("turn.heartbeat_failed", extra={"keys": len(entries)})
                continue
            for (slot, _, key, _, _, renew), result in zip(entries, results, strict=True):
                if not result:
                    result = self._take_again(slot, key, renew)
                    if result is None:
                        continue  # Redis went away again: the next beat tries
                if not self.record(slot, alive=bool(result)):
                    log.warning("turn.hold_lost", extra={"owner_key": key, "by": "heartbeat"})

    def _take_again(self, slot: Slot, key: str, renew: Renew | None) -> bool | None:
        """A lapsed key: taken again (True), lost (False), or unknown (None: Redis away)."""
        if renew is None or not self.holds(slot):
            return False
        try:
            taken = renew()
        except REDIS_ERRORS:
            return None
        if taken:
            log.warning("turn.hold_renewed", extra={"owner_key": key})
        return taken


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
        self.claimed = lua.Claimed(queued=None, cancelled=False)
        """What the claim found (:meth:`claim`): the queued entry it took, a cancel marked."""

    # -- claim and heartbeat ---------------------------------------------------------------

    def token_for(self, delivery: str | None) -> str:
        """The token this attempt claims the turn with (fixed by its first call): the same
        for a retry of the same delivery, so a claim whose reply was lost is recognised. A
        key slot taken before the claim is held under it (worker/spend/slots.py), so only the
        copy that wins the claim keeps its slot."""
        if not self._token:
            self._token = f"{self.deps.worker_id}/{delivery or uuid.uuid4().hex}"
        return self._token

    def claim(self, delivery: str | None) -> bool:
        """Take the turn; its heartbeat beats from now until :meth:`release`. False when
        another delivery took it first. Redis errors propagate: nothing has happened yet, so
        the delivery may simply be tried again."""
        deps, ref = self.deps, self.ref
        with _in_flight_lock:
            if self._slot in _in_flight:
                return False
            _in_flight.add(self._slot)
        claimed = None
        token = self.token_for(delivery)
        try:
            claimed = lua.scripts(deps.redis).claim_turn(
                (
                    deps.keys.turn_started(ref.run_id, ref.turn),
                    self._owner_key,
                    deps.keys.events(ref.run_id),
                    deps.keys.run(ref.run_id),
                    deps.keys.turn_queued(ref.run_id, ref.turn),
                    deps.keys.cancel(ref.run_id, ref.turn),
                ),
                ref.turn,
                token,
                deps.settings.retention_s + deps.settings.run_lease_s,
                deps.settings.heartbeat_ttl_s,
            )
        finally:
            if claimed is None:
                with _in_flight_lock:
                    _in_flight.discard(self._slot)
        if claimed is not None:
            self.claimed = claimed
            HEARTBEATS.hold(
                self._slot,
                deps.redis,
                self._owner_key,
                token,
                deps.settings.heartbeat_ttl_s,
                renew=self._renew,
            )
        return claimed is not None

    def _renew(self) -> bool:
        """Take the hold again if the turn is still ours and has not ended (it lapsed)."""
        deps, ref = self.deps, self.ref
        return lua.scripts(deps.redis).renew_hold(
            (
                deps.keys.turn_started(ref.run_id, ref.turn),
                self._owner_key,
                deps.keys.events(ref.run_id),
            ),
            ref.turn,
            self._token,
            deps.settings.heartbeat_ttl_s,
        )

    @property
    def _slot(self) -> Slot:
        return (self.deps.keys.prefix, self.ref.run_id, self.ref.turn)

    def confirm_hold(self) -> SessionError | None:
        """Just before the harness starts: None while this worker still holds the turn, else
        the turn's end (``worker-lost``), and the harness must not start.

        A harness started after the turn was ended elsewhere would, as its first step, kill
        the harness of the run's next turn as a stray of an earlier one. So the hold must
        stand for a while yet: one not known to be set for half its TTL is renewed now (one
        script call, which takes a lapsed hold again unless a reaper ended the turn; a turn
        that starts within half a TTL of its last beat, as nearly all do, needs none), which
        leaves any reaper at least half a TTL away."""
        slot, ttl = self._slot, self.deps.settings.heartbeat_ttl_s
        if HEARTBEATS.lost(slot):
            return _hold_lost()
        confirmed = HEARTBEATS.confirmed_at(slot)
        if confirmed is not None and time.monotonic() - confirmed < ttl / 2:
            return None
        if HEARTBEATS.record(slot, alive=self.patience.call(self._renew)):
            return None
        log.warning("turn.hold_lost", extra={"owner_key": self._owner_key, "by": "start"})
        return _hold_lost()

    def stop_check(self) -> Callable[[], SessionError | None]:
        """What the read loop asks every poll, of this process alone: stop for a lost hold or
        shutdown? (A cancel is asked of Redis with the turn's messages, less often:
        :class:`worker.turn.steering.Steering`.)"""
        deps, slot = self.deps, self._slot

        def check() -> SessionError | None:
            if HEARTBEATS.lost(slot):  # another worker ended the turn: stop its harness
                return _hold_lost()
            if deps.shutdown.expired():
                return session_error("the worker is shutting down", "shutdown")
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
        deps, ref = self.deps, self.ref
        return self.patience.call(
            lambda: credentials.issue(deps.redis, deps.keys, ref.run_id, ttl, turn=ref.turn)
        )

    def revoke_credential(self) -> None:
        """Revoke this turn's credential (never a later turn's)."""
        deps, ref = self.deps, self.ref
        self.patience.call(
            lambda: credentials.revoke(deps.redis, deps.keys, ref.run_id, through=ref.turn)
        )

    # -- the record ----------------------------------------------------------------------------

    def record_now(self, changes: RecordChanges) -> None:
        """Facts the record must hold before the turn ends (the session its harness announced:
        a worker lost mid-turn leaves it for the next turn to resume): written now, while this
        worker holds the turn, and again with its terminal (:meth:`end`). A Redis error here
        leaves them to the end: the read loop never waits for Redis."""
        self.changes.update(changes)
        if HEARTBEATS.lost(self._slot):
            return  # another worker ended the turn: the record is not this one's to write
        try:
            self.deps.store.update(self.ref.run_id, **changes)
        except REDIS_ERRORS:
            log.warning("turn.record_deferred", extra={"run_id": self.ref.run_id})

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


def _hold_lost() -> SessionError:
    return session_error(
        "this worker lost its hold on the turn: its heartbeat lapsed for "
        "HARNESS_HEARTBEAT_TTL_S (Redis unreachable, or the worker stalled) and another worker "
        "ended the turn as lost",
        "worker-lost",
    )
