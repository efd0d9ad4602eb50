"""The messages a person sends to a running turn (``harness steer --mode steer|interrupt``),
taken by its read loop as it polls for a cancel (:mod:`worker.control.messages`).

A ``steer`` the turn's harness takes mid-turn (its adapter's ``steer`` writes a line on the
harness's own channel: capability ``steering``) is published as a ``user-message`` of this
turn, ``delivery: native``, in order with the turn's events. Anything else stops the turn as
a cancel does (``session-error``, reason ``cancelled``, saying why) and goes to the run's
inbox: the next turn starts with it, in the same vendor session, and publishes it there
(``delivery: emulated`` for a steer, ``next-turn`` for an interrupt).
"""

from __future__ import annotations

import logging

from adapters.events import SessionError, session_error
from adapters.protocol import Adapter, AdapterState
from sandbox.base import Process
from worker.control import messages
from worker.control.messages import Message
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis
from worker.turn.attempt import Publishing

log = logging.getLogger(__name__)


class Steering:
    """One turn's incoming messages: :meth:`attach` binds it to a harness process (each
    attempt's), :meth:`poll` is the read loop's, before each cancel check is trusted."""

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

    def attach(self, adapter: Adapter[AdapterState], state: AdapterState, process: Process) -> None:
        self._adapter, self._state, self._process = adapter, state, process

    def poll(self) -> SessionError | None:
        """Take what was sent to the turn; the turn's stop when one of them stops it. Redis
        being away is ridden out (the messages wait in their list)."""
        try:
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
