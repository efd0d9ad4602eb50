"""The life of one turn, owned in one place: its claim, its owner heartbeat, the run's
credential, its patience with Redis, and the one writer of its terminal event.

Every path that ends a turn goes through :func:`write_terminal`: completed, refused,
cancelled in the queue, cancelled by a client, lost with its worker, waited too long for its
host, an internal error of the worker before or after the claim, shutdown. It is one script
(``end_turn.lua``) that checks the caller may end the turn and that the turn has no terminal
yet, then writes the terminal entry (``turn-started`` first when the turn has no event) and
the record together: a consumer who sees the end of a turn finds the record updated, and
two enders racing (a cancel and a claim, a reaper and a slow owner) leave one terminal that
the record agrees with.

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
from dataclasses import dataclass
from typing import TypeVar

from adapters.events import Event, SessionError, TurnStarted, session_error
from config import Settings
from worker.observe import metrics
from worker.store import credentials, lua
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, RedisClient
from worker.store.publisher import Masker, RedisStreamPublisher
from worker.store.records import RecordChanges, RunStore
from worker.store.status import RunStatus
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
    patience.call(lambda: ref.store.expire(ref.run_id, keep_s))
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
        while True:
            with self._lock:
                held = list(self._held.values())
            interval = min((ttl / 3 for *_, ttl in held), default=1.0)
            self._changed.wait(max(interval, 0.2))
            self._changed.clear()
            with self._lock:
                held = list(self._held.values())
            self.beat(held)

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

    def __init__(self, deps: TurnDeps, run_id: str, turn: int, harness: str) -> None:
        self.deps = deps
        self.ref = TurnRef(deps.redis, deps.keys, deps.store, deps.settings, run_id, turn, harness)
        self.patience = Patience()
        self.publisher: RedisStreamPublisher | None = None
        """The turn's publisher once it has published its ``turn-started``."""
        self.usage: Callable[[], Usage] = lambda: NO_USAGE
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
                deps.keys.turn_started(ref.run_id, ref.turn),
                self._owner_key,
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
        write_terminal(
            self.ref,
            terminal,
            run_status=run_status,
            caller=f"owner:{self._token}",
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
