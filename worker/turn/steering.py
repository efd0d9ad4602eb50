"""The messages a person sends to a running turn (``harness steer --mode steer|interrupt``)
and its cancel, taken by its read loop when the turn's bell rings and at its slow fallback
poll (:mod:`worker.control.messages`, :mod:`worker.control.cancel`).

A ``steer`` the turn's harness takes mid-turn (its adapter's ``steer`` writes a line on the
harness's own channel: capability ``steering``) is published as a ``user-message`` of this
turn, ``delivery: native``, in order with the turn's events. Anything else stops the turn as
a cancel does (``session-error``, reason ``cancelled``, saying why) and goes to the run's
inbox: the next turn starts with it, in the same vendor session, and publishes it there
(``delivery: emulated`` for a steer, ``next-turn`` for an interrupt).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from adapters.events import SessionError, session_error
from adapters.protocol import Adapter, AdapterState
from sandbox.base import Process
from worker.control import cancel, messages
from worker.control.messages import Message
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis
from worker.turn.attempt import Publishing

log = logging.getLogger(__name__)


Ring = Callable[[], None]


class Bell:
    """Wakes the read loop of a turn a message or a cancel was just sent to, so that it
    reaches the turn within milliseconds and the loop need not ask Redis often: one
    subscriber per process (``Keys.messages_channel``), told ``RUN_ID:TURN`` by the sender
    after the message is in the turn's list or the cancel marked. A missed ring costs only
    latency: the loop's slow poll still finds what was sent, and while the subscriber is not
    listening (:meth:`listening`) the loop polls fast."""

    def __init__(self) -> None:
        self._rings: dict[tuple[str, str, int], Ring] = {}
        self._listening: set[tuple[int, str]] = set()
        """(the client's id, channel): one subscriber per Redis client (a process has one)."""
        self._subscribed: set[tuple[int, str]] = set()
        """Those of :attr:`_listening` whose subscription stands now."""
        self._lock = threading.Lock()

    def register(self, client: Any, keys: Keys, run_id: str, turn: int, ring: Ring) -> None:
        channel = keys.messages_channel()
        with self._lock:
            self._rings[(keys.prefix, run_id, turn)] = ring
            if (id(client), channel) in self._listening:
                return
            self._listening.add((id(client), channel))
        threading.Thread(
            target=self._listen, args=(client, keys.prefix, channel), name="message-bell",
            daemon=True,
        ).start()  # fmt: skip

    def unregister(self, keys: Keys, run_id: str, turn: int) -> None:
        with self._lock:
            self._rings.pop((keys.prefix, run_id, turn), None)

    def listening(self, client: Any, keys: Keys) -> bool:
        """Whether a ring sent now reaches this process (its subscription stands)."""
        return (id(client), keys.messages_channel()) in self._subscribed

    def _listen(self, client: Any, prefix: str, channel: str) -> None:
        subscriber = (id(client), channel)
        first = True
        while True:
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(channel)
                for item in pubsub.listen():
                    if item.get("type") == "message":
                        self._ring(prefix, item.get("data"))
                    elif item.get("type") == "subscribe":
                        # (Again after redis-py reconnected on its own: a read timeout.)
                        with self._lock:
                            self._subscribed.add(subscriber)
                        if not first:
                            self._ring_all(prefix)  # what was sent while it was away
                        first = False
            except Exception as exc:  # noqa: BLE001 -- Redis away: the loop's poll still works
                with self._lock:
                    self._subscribed.discard(subscriber)
                log.debug("messages.bell_lost", extra={"error": str(exc)})
                with contextlib.suppress(Exception):
                    pubsub.close()
                time.sleep(1.0)

    def _ring_all(self, prefix: str) -> None:
        with self._lock:
            rings = [ring for (at, _, _), ring in self._rings.items() if at == prefix]
        for ring in rings:
            ring()

    def _ring(self, prefix: str, data: object) -> None:
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        if not isinstance(data, str):
            return
        run_id, _, turn = data.rpartition(":")
        if not turn.isdigit():
            return
        with self._lock:
            ring = self._rings.get((prefix, run_id, int(turn)))
        if ring is not None:
            ring()


BELL = Bell()


class Steering:
    """One turn's incoming messages and its cancel: :meth:`attach` binds it to a harness
    process (each attempt's), :meth:`poll` is the read loop's, when the bell rang and at the
    loop's fallback poll."""

    def __init__(
        self, client: SyncRedis, keys: Keys, run_id: str, turn: int, out: Publishing, ttl_s: int
    ) -> None:
        self.client, self.keys, self.run_id, self.turn = client, keys, run_id, turn
        self.out, self.ttl_s = out, ttl_s
        self._adapter: Adapter[AdapterState] | None = None
        self._state: AdapterState | None = None
        self._process: Process | None = None
        self.stop: SessionError | None = None
        """Why the turn stops for a message (an interrupt, a steer it could not take)."""
        self.rung = False
        """A message or a cancel was sent to the turn since the last :meth:`poll` (the loop
        polls now)."""

    def attach(self, adapter: Adapter[AdapterState], state: AdapterState, process: Process) -> None:
        self._adapter, self._state, self._process = adapter, state, process
        BELL.register(self.client, self.keys, self.run_id, self.turn, self._rang)

    def _rang(self) -> None:
        self.rung = True
        process = self._process
        if process is not None:
            process.nudge()

    def close(self) -> None:
        """The turn's harness is done: no more rings for it."""
        BELL.unregister(self.keys, self.run_id, self.turn)

    @property
    def ringing(self) -> bool:
        """Whether what is sent to the turn now rings it (else the loop polls fast)."""
        return BELL.listening(self.client, self.keys)

    def poll(self) -> SessionError | None:
        """The turn's stop when it was cancelled; else take what was sent to it, and its stop
        when one of them stops it. Redis being away is ridden out (the mark and the messages
        wait; the messages of a cancelled turn are left in their list, for the next turn)."""
        self.rung = False
        try:
            if cancel.marked(self.client, self.keys, self.run_id, self.turn):
                return session_error("the turn was cancelled", "cancelled")
            taken = messages.take_for_turn(self.client, self.keys, self.run_id, self.turn)
        except REDIS_ERRORS:
            return self.stop
        if not taken:
            return self.stop
        onward: list[Message] = []
        for message in taken:
            if self.stop is None and message.mode == "steer" and self._native(message):
                self.out.send([message.event("native")])
                continue
            emulated = message.mode == "steer"
            onward.append(message.model_copy(update={"emulated": emulated}))
            if self.stop is None:
                how = "a steer it cannot take mid-turn" if emulated else "an interrupt"
                self.stop = session_error(
                    f"the turn was stopped by a message ({how}) from {message.by}: it starts "
                    "the next turn, in the same session",
                    "cancelled",
                )
        try:
            messages.to_inbox(self.client, self.keys, self.run_id, onward, self.ttl_s)
        except REDIS_ERRORS:
            log.warning("messages.inbox_deferred", extra={"run_id": self.run_id})
            self._put_back(onward)
        return self.stop

    def _native(self, message: Message) -> bool:
        adapter, state, process = self._adapter, self._state, self._process
        if adapter is None or state is None or process is None:
            return False
        if not adapter.steer(state, message.text):
            return False
        written = True
        while state.outbox:
            written = process.write(state.outbox.pop(0)) and written
        return written

    def _put_back(self, onward: list[Message]) -> None:
        """The inbox could not be written: the messages go back to the turn's list, which
        the delivery after the turn's end carries over."""
        for message in onward:
            try:
                messages.to_turn(
                    self.client, self.keys, self.run_id, self.turn, message, self.ttl_s
                )
            except REDIS_ERRORS:
                log.error("messages.lost", extra={"run_id": self.run_id, "id": message.message_id})
