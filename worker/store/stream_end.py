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

A run can also be *lost* (:func:`lost`): its record is gone while its stream does not end
with a terminal event. Redis lost it (restarted without persistence, flushed, or evicting
keys under ``maxmemory``), or the run's retention ran out during a turn. Its stream ends there
too, but the run did not finish: a follower that has read up to :func:`end_of` says the run
is lost (``worker.errors.StreamLost``) rather than ending as if it had finished, and never
waits for events that cannot come. Nothing recreates a lost stream: only a run's first event
(``1-0``) creates it (worker/store/publisher.py).
"""

from __future__ import annotations

from typing import Any

from adapters.events import TERMINAL_TYPES
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


def lost(status: str | None, newest: list[Any] | None) -> bool:
    """Whether the run is lost: its record is gone and its stream, if any, does not end with
    a terminal event. ``status`` and ``newest`` are the replies of :func:`ask`."""
    if status is not None:
        return False
    if not newest:
        return True
    fields = newest[0][1]
    kind = fields.get("type", fields.get(b"type")) if isinstance(fields, dict) else None
    if isinstance(kind, bytes):
        kind = kind.decode()
    return kind not in TERMINAL_TYPES


def reached(cursor: str, end: str) -> bool:
    """Whether a follower that has read up to ``cursor`` has read the entry ``end``."""
    return _key(cursor) >= _key(end)


def read(client: SyncRedis, keys: Keys, run_id: str) -> str | None:
    """:func:`end_of` the run, read now."""
    return read_end(client, keys, run_id)[0]


def read_end(client: SyncRedis, keys: Keys, run_id: str) -> tuple[str | None, bool]:
    """:func:`end_of` the run and whether it is :func:`lost`, read now."""
    pipe = client.pipeline(transaction=False)
    ask(pipe, keys, run_id)
    status, newest = pipe.execute()
    return end_of(status, newest), lost(status, newest)


def _key(entry_id: str) -> tuple[int, int]:
    turn, _, seq = entry_id.partition("-")
    return int(turn), int(seq or 0)
