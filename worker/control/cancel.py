"""A cancel of a turn in flight: its mark in Redis (``Keys.cancel``), written here only, and
read by the turn's worker (:mod:`worker.turn.steering`; :mod:`worker.store.lua`'s claim reads
it too, for a cancel that came before the turn was claimed)."""

from __future__ import annotations

from worker.control.messages import ring
from worker.store.keys import Keys, SyncRedis


def mark(client: SyncRedis, keys: Keys, run_id: str, turn: int, ttl_s: int) -> None:
    """Mark turn ``turn`` cancelled and ring its worker's bell, which checks the mark at once.
    The mark is what counts: a ring that is missed only waits for the worker's next poll."""
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.cancel(run_id, turn), "1", ex=ttl_s)
    ring(pipe, keys, run_id, turn)
    pipe.execute()


def marked(client: SyncRedis, keys: Keys, run_id: str, turn: int) -> bool:
    return bool(client.exists(keys.cancel(run_id, turn)))
