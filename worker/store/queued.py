"""A queued turn: the payload of a turn sent to the broker and not yet taken by a worker,
kept in Redis (``Keys.turn_queued``) so that the reaper can send it again should the broker
lose it, and so that a producer can be told how long it has waited.

:class:`QueuedTurn` is the entry, typed; :func:`read` and :meth:`QueuedTurn.write` read and
write it, and the worker that takes the turn takes it with its claim (``claim_turn.lua``,
read back by :func:`entry_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.store.keys import Keys, SyncRedis

SendTurn = Callable[[dict[str, Any], str, float], None]
"""Send a turn's payload to a queue, to be delivered after ``countdown`` seconds: built once
by the Celery layer (``worker.app.turn_sender``) and passed down."""


class QueuedTurn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    payload: dict[str, Any]
    """The turn's task argument (``TurnPayload.model_dump()``)."""
    queue: str = ""
    sent_at: float
    """When it was last sent (or, for a turn that counts down, when it is due)."""
    first_sent_at: float
    """When it was sent first: what a producer is told it has waited since."""
    resume_at: float | None = None
    """For a parked turn: the reset it waits for."""

    @classmethod
    def first(
        cls, payload: dict[str, Any], queue: str, at: float, *, resume_at: float | None = None
    ) -> QueuedTurn:
        return cls(payload=payload, queue=queue, sent_at=at, first_sent_at=at, resume_at=resume_at)

    def sent_again(self, at: float) -> QueuedTurn:
        """The same turn, sent again at ``at`` (its first send is kept)."""
        return self.model_copy(update={"sent_at": at})

    def write(self, client: SyncRedis, keys: Keys, run_id: str, turn: int, ttl_s: int) -> None:
        client.set(keys.turn_queued(run_id, turn), self.model_dump_json(), ex=ttl_s)


def read(client: SyncRedis, keys: Keys, run_id: str, turn: int) -> QueuedTurn | None:
    """The turn's entry, or None once a worker took it (or it was withdrawn)."""
    text = client.get(keys.turn_queued(run_id, turn))
    if not text:
        return None
    return QueuedTurn.model_validate_json(text)


def entry_of(text: str | None) -> QueuedTurn | None:
    """The entry a worker's claim of the turn took (``claim_turn.lua`` removes it as it sets
    the started mark), or None when it was gone."""
    return QueuedTurn.model_validate_json(text) if text else None
