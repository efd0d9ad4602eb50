"""The run's inbox becomes its next turn: the one place that does it (:func:`deliver`).

Called by whoever may have just made it possible: the worker whose turn just ended (every
path of :func:`worker.turn.execute.execute_turn`, and the closing of a lost turn), the
producer that sent a message to an idle run, and, as a backstop for a process that died in
between, the reaper for every run in ``Keys.inboxes``. Safe from all of them at once: the turn
is begun first (``begin_turn.lua`` refuses while one is in flight, and once the run was asked
to end), the messages taken after (``LPOP``: one taker gets each), and a turn that finds the
inbox emptied by a concurrent delivery is given back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from config import Settings
from worker.control.messages import Message, carry_over, take_inbox, waiting
from worker.deps import TurnDeps
from worker.errors import RunBusy, RunEnded, RunNotFound
from worker.options.spec import TurnPayload
from worker.spend import budgets
from worker.store.keys import Keys, SyncRedis
from worker.store.queued import QueuedTurn, SendTurn
from worker.store.records import RunStore
from worker.store.status import IN_FLIGHT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Post:
    """What a delivery needs: Redis, the runs, the settings and a way to send a turn."""

    client: SyncRedis
    keys: Keys
    store: RunStore
    settings: Settings
    send: SendTurn

    @property
    def ttl_s(self) -> int:
        return int(self.settings.retention_s + self.settings.run_lease_s)


def post_for(deps: TurnDeps) -> Post:
    return Post(deps.redis, deps.keys, deps.store, deps.settings, deps.send_turn)


def after_turn(deps: TurnDeps, run_id: str, turn: int) -> None:
    """A turn of the run has just ended: deliver what waits (one ``EXISTS`` when nothing
    does). Never raises: the reaper's backstop delivers what this could not."""
    try:
        keys = deps.keys
        if deps.redis.exists(keys.inbox(run_id), keys.turn_messages(run_id, turn)):
            deliver(post_for(deps), run_id)
    except Exception:
        log.exception("messages.delivery_failed", extra={"run_id": run_id, "turn": turn})


def deliver(post: Post, run_id: str) -> int | None:
    """Start the run's next turn with the messages waiting for it; its number, or None when
    nothing was started (nothing waits, a turn is in flight and will deliver at its end, the
    run ended, or its budget refuses a turn: then the messages stay and ``last_error`` says
    why)."""
    client, keys, store = post.client, post.keys, post.store
    record = store.find(run_id)
    if record is None:
        client.srem(keys.inboxes(), run_id)
        return None
    if record.status in IN_FLIGHT:
        return None
    if record.turns:
        carry_over(client, keys, run_id, record.turns, post.ttl_s)
    if not waiting(client, keys, run_id):
        client.srem(keys.inboxes(), run_id)
        return None
    if record.status == "ended" or record.end_requested_at is not None:
        _discard(post, run_id, "the run ended")
        return None
    over = budgets.submit_refusal(record, post.settings)
    if over is not None:
        client.srem(keys.inboxes(), run_id)  # a raised budget and the next message retry
        note = over.error("for the messages waiting in its inbox").error.replace("RUN_ID", run_id)
        store.update(run_id, last_error=note[:500])
        return None
    try:
        turn = store.begin_turn(run_id)
    except RunBusy:
        return None  # a turn began meanwhile: its end delivers
    except RunEnded:
        _discard(post, run_id, "the run ended")
        return None
    except RunNotFound:
        return None
    taken = take_inbox(client, keys, run_id, post.settings.max_input_bytes)
    if not taken:
        store.unbegin_turn(run_id, turn)  # a concurrent delivery took them
        return None
    if not waiting(client, keys, run_id):
        client.srem(keys.inboxes(), run_id)
    # The run's queue (its host's once a turn placed it; the harness's before).
    queue = store.record(run_id).queue or record.queue or f"{keys.prefix}.{record.harness}"
    payload = TurnPayload(
        run_id=run_id,
        turn=turn,
        input=input_of(taken),
        messages=tuple(m.as_payload() for m in taken),
    ).model_dump()
    QueuedTurn.first(payload, queue, time.time()).write(
        client, keys, run_id, turn, post.settings.retention_s
    )
    try:
        post.send(payload, queue, 0.0)
    except Exception:  # the queued entry stays: the reaper sends it again
        log.exception("messages.send_failed", extra={"run_id": run_id, "turn": turn})
    else:
        log.info("messages.delivered", extra={"run_id": run_id, "turn": turn, "n": len(taken)})
    return turn


def input_of(messages: list[Message]) -> str:
    """The turn input of the messages it delivers: their texts, in order."""
    return "\n\n".join(m.text for m in messages)


def _discard(post: Post, run_id: str, why: str) -> None:
    dropped = take_inbox(post.client, post.keys, run_id)
    post.client.srem(post.keys.inboxes(), run_id)
    if dropped:
        log.info(
            "messages.discarded", extra={"run_id": run_id, "messages": len(dropped), "why": why}
        )
