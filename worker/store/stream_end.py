"""When a run's stream has ended: the one rule of every follower of a run (the client's
``follow_run`` under ``harness events --follow``, the API's SSE hub, the webhook scanner).

A run's record says ``ended`` or ``failed`` only once every turn the run began has its
terminal event in the stream: ``failed`` is written with the terminal that fails the run
(``end_turn.lua``), ``ended`` by the run's end, which writes in the same script the terminal
of a turn it finds in flight (``end_run.lua``). Nothing is written to the stream after that
(a worker still running such a turn finds its events dropped). So a follower reads the
record's status, then the stream's newest entry id (:func:`ask`, in that order): once the
status is finished, or the record is gone, that id is where the stream ends
(:func:`end_of`), and a follower that has read up to it (:func:`reached`) has every event of
the run. No grace period is needed, and none is waited: nothing of the run comes later.
"""

from __future__ import annotations

from typing import Any

from worker.store.keys import Keys, SyncRedis
from worker.store.status import FINISHED

START = "0-0"
"""Before every entry (the end of a stream that has none)."""


def ask(pipe: Any, keys: Keys, run_id: str) -> None:
    """Queue on ``pipe`` (a pipeline, sync or asyncio) the two reads :func:`end_of` takes:
    the run's status, then its stream's newest entry."""
    pipe.hget(keys.run(run_id), "status")
    pipe.xrevrange(keys.events(run_id), count=1)


def end_of(status: str | None, newest: list[Any] | None) -> str | None:
    """The id of the run's last entry once its stream has ended (:data:`START` when it has
    none), else None: the run may still take turns. ``status`` and ``newest`` are the
    replies of :func:`ask`, read in that order."""
    if status is not None and status not in FINISHED:
        return None
    return str(newest[0][0]) if newest else START


def reached(cursor: str, end: str) -> bool:
    """Whether a follower that has read up to ``cursor`` has read the entry ``end``."""
    return _key(cursor) >= _key(end)


def read(client: SyncRedis, keys: Keys, run_id: str) -> str | None:
    """:func:`end_of` the run, read now."""
    pipe = client.pipeline(transaction=False)
    ask(pipe, keys, run_id)
    status, newest = pipe.execute()
    return end_of(status, newest)


def _key(entry_id: str) -> tuple[int, int]:
    turn, _, seq = entry_id.partition("-")
    return int(turn), int(seq or 0)
