"""``HarnessClient.steer``: a person's message to a run (docs/events.md, "Messages to a run").

``queue`` waits for the turn in flight to end and becomes the next turn; ``steer`` goes into
the running turn (on the harness's own channel where its capability ``steering`` says so,
else the turn is stopped and the message starts the next one); ``interrupt`` stops the
running turn as a cancel does and starts the next one with the message, in the same vendor
session. To a run with no turn in flight, every mode starts the next turn at once. The
message waits in Redis until a turn takes it (:mod:`worker.control.messages`): a worker dying
in between loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from adapters.events import SteerMode
from config import Settings
from worker.control import messages
from worker.control.delivery import Post, deliver
from worker.control.messages import Message
from worker.errors import BudgetSpent, InvalidInput, RunEnded
from worker.options.policy import check_input
from worker.options.spec import check_run_id
from worker.permissions.requests import who
from worker.spend import budgets
from worker.store.keys import Keys, SyncRedis
from worker.store.queued import SendTurn
from worker.store.records import RunStore
from worker.store.status import IN_FLIGHT

MAX_BY_CHARS = 200


class Steering:
    """Messages to runs, for :class:`worker.client.harness.HarnessClient`."""

    def __init__(
        self,
        settings: Settings,
        client: SyncRedis,
        keys: Keys,
        store: RunStore,
        send: Callable[[], SendTurn],
        cancel: Callable[[str], bool],
    ) -> None:
        self.settings, self.client, self.keys, self.store = settings, client, keys, store
        self._send, self._cancel = send, cancel

    def post(self) -> Post:
        return Post(self.client, self.keys, self.store, self.settings, self._send())

    def steer(
        self, run_id: str, text: str, *, mode: str = "queue", by: str | None = None
    ) -> dict[str, Any]:
        """Send ``text`` to the run; returns ``{"run_id", "message_id", "mode", "turn",
        "state"}``: ``state`` is ``sent-to-turn`` (the running turn ``turn`` takes it),
        ``queued`` (it waits for turn ``turn`` in flight to end) or ``started`` (it is the
        input of the new turn ``turn``). InvalidInput for an unknown mode or an empty or
        oversized text, RunEnded once the run was asked to end, BudgetSpent when the run's
        budget refuses the turn the message would start, RunNotFound."""
        check_run_id(run_id)
        if mode not in get_args(SteerMode):
            raise InvalidInput(
                f"unknown mode {str(mode)[:40]!r}: one of {', '.join(get_args(SteerMode))}"
            )
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("a message needs some text")
        check_input(text, self.settings)
        if by is not None and (
            not isinstance(by, str) or not by.strip() or any(ord(c) < 32 or c == "\x7f" for c in by)
        ):
            raise InvalidInput("by: 1 to 200 characters, no control characters")
        sender = (by if by is not None else who())[:MAX_BY_CHARS]
        record = self.store.record(run_id)
        if record.status == "ended" or record.end_requested_at is not None:
            raise RunEnded(run_id, "ended" if record.status == "ended" else "ending")
        message = Message.new(text, mode, sender)  # type: ignore[arg-type]
        ttl = int(self.settings.retention_s + self.settings.run_lease_s)
        answer = {"run_id": run_id, "message_id": message.message_id, "mode": mode}
        current = record.current_turn or record.turns
        waiting = messages.count_waiting(self.client, self.keys, run_id, current)
        if waiting >= self.settings.max_waiting_messages:
            raise InvalidInput(
                f"run {run_id} has {waiting} messages waiting already "
                f"(HARNESS_MAX_WAITING_MESSAGES={self.settings.max_waiting_messages}): "
                "send more once turns have taken them"
            )
        if record.status in IN_FLIGHT and current:
            if mode == "queue":
                messages.to_inbox(self.client, self.keys, run_id, [message], ttl)
                state = "queued"
            elif record.status == "parked":
                # The parked turn waits for a reset: withdrawn, the message goes first.
                messages.to_inbox(self.client, self.keys, run_id, [message], ttl)
                self._cancel(run_id)
                state = "queued"
            else:
                messages.to_turn(self.client, self.keys, run_id, current, message, ttl)
                state = "sent-to-turn"
            started = deliver(self.post(), run_id)  # the turn may have ended meanwhile
            if started is not None:
                return {**answer, "turn": started, "state": "started"}
            return {**answer, "turn": current, "state": state}
        over = budgets.submit_refusal(record, self.settings)
        if over is not None:
            raise BudgetSpent(
                f"run {run_id}: {over.error('for the turn this message starts').error}".replace(
                    "RUN_ID", run_id
                )
            )
        messages.to_inbox(self.client, self.keys, run_id, [message], ttl)
        started = deliver(self.post(), run_id)
        if started is not None:
            return {**answer, "turn": started, "state": "started"}
        # A turn began meanwhile: another delivery's (the worker whose turn just ended found
        # the message and started it), or another producer's (the message waits for its end).
        fresh = self.store.record(run_id)
        turn = fresh.current_turn or fresh.turns
        waits = messages.in_inbox(self.client, self.keys, run_id, message.message_id)
        return {**answer, "turn": turn, "state": "queued" if waits else "started"}
