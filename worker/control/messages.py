"""A person's messages to a run (``harness steer``): where each waits, and who takes it.

Two lists per run, in Redis, so that no message is lost when a process dies:

- the *turn's* list (``Keys.turn_messages``): ``steer`` and ``interrupt`` messages sent while
  turn N is in flight. Its worker takes them as it polls for a cancel
  (:mod:`worker.turn.steering`): a ``steer`` its harness can take mid-turn is written on the
  harness's own channel; anything else stops the turn and moves on to the inbox.
- the run's *inbox* (``Keys.inbox``): what waits for the next turn (``queue`` messages, an
  interrupt's, a ``steer`` the harness could not take, and whatever reached the turn's list
  too late). :func:`worker.control.delivery.deliver` turns it into the next turn.

A message is JSON (:class:`Message`); ``at`` is when it was sent. Taking is atomic (``LPOP``
with a count, ``LMOVE``): two takers never both get one message.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from adapters.events import Delivery, SteerMode, UserMessage
from worker.store.keys import Keys, SyncRedis

TAKE_AT_ONCE = 1000
"""At most this many messages are taken in one call (an inbox longer than that is delivered
over several turns, in order)."""


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    message_id: str
    text: str
    mode: SteerMode
    by: str
    at: float
    emulated: bool = False
    """A ``steer`` that its turn's harness could not take mid-turn: it starts the next turn."""

    @classmethod
    def new(cls, text: str, mode: SteerMode, by: str) -> Message:
        return cls(message_id=f"m-{uuid.uuid4().hex[:16]}", text=text, mode=mode, by=by,
                   at=time.time())  # fmt: skip

    def event(self, delivery: Delivery) -> UserMessage:
        return UserMessage(
            text=self.text,
            mode=self.mode,
            by=self.by,
            delivery=delivery,
            message_id=self.message_id,
        )

    def as_payload(self) -> dict[str, Any]:
        return self.model_dump()


def to_turn(
    client: SyncRedis, keys: Keys, run_id: str, turn: int, message: Message, ttl_s: int
) -> None:
    """Hand ``message`` to turn ``turn`` while it runs."""
    key = keys.turn_messages(run_id, turn)
    pipe = client.pipeline(transaction=True)
    pipe.execute_command("RPUSH", key, message.model_dump_json())
    pipe.expire(key, ttl_s)
    ring(pipe, keys, run_id, turn)
    pipe.execute()


def ring(pipe: Any, keys: Keys, run_id: str, turn: int) -> None:
    """Add to ``pipe``, after what it writes for turn ``turn`` (a message, a cancel), the ring
    that wakes the turn's read loop to look at once (:class:`worker.turn.steering.Bell`)."""
    pipe.execute_command("PUBLISH", keys.messages_channel(), f"{run_id}:{turn}")


def to_inbox(
    client: SyncRedis, keys: Keys, run_id: str, messages: list[Message], ttl_s: int
) -> None:
    """Leave ``messages`` for the run's next turn, after those already there."""
    if not messages:
        return
    key = keys.inbox(run_id)
    pipe = client.pipeline(transaction=True)
    pipe.execute_command("RPUSH", key, *(m.model_dump_json() for m in messages))
    pipe.expire(key, ttl_s)
    pipe.sadd(keys.inboxes(), run_id)
    pipe.execute()


def take_for_turn(client: SyncRedis, keys: Keys, run_id: str, turn: int) -> list[Message]:
    """The messages sent to the running turn since the last call, oldest first."""
    raw = client.execute_command("LPOP", keys.turn_messages(run_id, turn), TAKE_AT_ONCE)
    return _parsed(raw)


def pending_for_turn(client: SyncRedis, keys: Keys, run_id: str, turn: int) -> bool:
    return bool(client.exists(keys.turn_messages(run_id, turn)))


def carry_over(client: SyncRedis, keys: Keys, run_id: str, turn: int, ttl_s: int) -> int:
    """Move what turn ``turn`` never took (it ended first) to the inbox, in order; how many."""
    source, target = keys.turn_messages(run_id, turn), keys.inbox(run_id)
    moved = 0
    while client.execute_command("LMOVE", source, target, "LEFT", "RIGHT"):
        moved += 1
    if moved:
        client.expire(target, ttl_s)
        client.sadd(keys.inboxes(), run_id)
    return moved


def take_inbox(
    client: SyncRedis, keys: Keys, run_id: str, max_bytes: int | None = None
) -> list[Message]:
    """The oldest messages of the inbox whose texts fit in ``max_bytes`` together (the
    first one always: each was checked against the limit alone), up to
    :data:`TAKE_AT_ONCE`; the rest stay for the turn after. Only the holder of the run's
    next turn takes (``begin_turn`` made it the one), so reading then trimming is safe:
    others only append."""
    key = keys.inbox(run_id)
    head = _parsed(client.lrange(key, 0, TAKE_AT_ONCE - 1))
    count, size = 0, 0
    for message in head:
        size += len(message.text.encode("utf-8")) + (2 if count else 0)
        if count and max_bytes is not None and size > max_bytes:
            break
        count += 1
    if not count:
        return []
    return _parsed(client.execute_command("LPOP", key, count))


def count_waiting(client: SyncRedis, keys: Keys, run_id: str, turn: int | None) -> int:
    """The messages waiting for the run: in its inbox and, with ``turn``, in that turn's
    list."""
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("LLEN", keys.inbox(run_id))
    if turn:
        pipe.execute_command("LLEN", keys.turn_messages(run_id, turn))
    return sum(int(n or 0) for n in pipe.execute())


def give_back(
    client: SyncRedis, keys: Keys, run_id: str, messages: list[Message], ttl_s: int
) -> None:
    """Put taken messages back at the head of the inbox (a turn that could not be begun)."""
    if not messages:
        return
    key = keys.inbox(run_id)
    pipe = client.pipeline(transaction=True)
    pipe.execute_command("LPUSH", key, *(m.model_dump_json() for m in reversed(messages)))
    pipe.expire(key, ttl_s)
    pipe.sadd(keys.inboxes(), run_id)
    pipe.execute()


def in_inbox(client: SyncRedis, keys: Keys, run_id: str, message_id: str) -> bool:
    """Whether message ``message_id`` still waits in the inbox (not taken by a turn yet)."""
    return any(
        m.message_id == message_id for m in _parsed(client.lrange(keys.inbox(run_id), 0, -1))
    )


def waiting(client: SyncRedis, keys: Keys, run_id: str) -> int:
    """How many messages wait in the inbox."""
    return int(client.execute_command("LLEN", keys.inbox(run_id)) or 0)


def _parsed(raw: object) -> list[Message]:
    if not raw:
        return []
    items = raw if isinstance(raw, list) else [raw]
    return [Message.model_validate_json(str(item)) for item in items]
