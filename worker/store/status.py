"""A run's status and the one table of its transitions.

The status field of a run record moves only by :data:`TRANSITIONS`, applied by the Lua
scripts of :mod:`worker.store.lua` (every script that changes a status calls the generated
``move`` function, so the table below is the only place a transition is allowed). No Python
code writes ``status``: :class:`worker.store.records.RecordChanges` has no such field.
"""

from __future__ import annotations

import json
from typing import Literal

RunStatus = Literal["starting", "running", "idle", "parked", "ended", "failed"]

IN_FLIGHT: tuple[RunStatus, ...] = ("starting", "running", "parked")
"""A turn holds the run: it was begun and has not ended (parked: its retry waits for a
reset). A run in flight refuses a new turn (``RunBusy``)."""
EXECUTING: tuple[RunStatus, ...] = ("starting", "running")
"""In flight and not parked: a worker has the turn, or is about to."""
FINISHED: tuple[RunStatus, ...] = ("ended", "failed")
"""A run that takes no more turns."""

Move = Literal[
    "begin",  # a new turn of an idle run
    "unbegin",  # that turn was never sent: the run is idle again
    "sandbox-ready",  # the first turn's sandbox exists
    "park",  # the turn meets a limit; its retry is scheduled
    "resume",  # the parked turn was taken again
    "finish-idle",  # the turn ended; the run waits for the next
    "finish-failed",  # the turn ended and the run cannot go on
    "finish-parked",  # the turn ended with its retry parked
    "end",  # the run is torn down
]

TRANSITIONS: dict[Move, tuple[frozenset[RunStatus], RunStatus]] = {
    "begin": (frozenset({"idle"}), "running"),
    "unbegin": (frozenset({"running", "starting"}), "idle"),
    "sandbox-ready": (frozenset({"starting"}), "running"),
    "park": (frozenset({"running", "starting"}), "parked"),
    "resume": (frozenset({"parked"}), "running"),
    "finish-idle": (frozenset(IN_FLIGHT), "idle"),
    "finish-failed": (frozenset(IN_FLIGHT), "failed"),
    "finish-parked": (frozenset(IN_FLIGHT), "parked"),
    "end": (frozenset({"starting", "running", "idle", "parked", "failed"}), "ended"),
}
"""Each move: the statuses it may leave, and the one it enters. A run is born ``starting``
(its first turn is begun with it)."""

FINISH_MOVES: dict[RunStatus, Move] = {
    "idle": "finish-idle",
    "failed": "finish-failed",
    "parked": "finish-parked",
}
"""The move that ends a turn, by the status the run is left in."""


def lua_prelude() -> str:
    """The table as Lua, prepended to every script: ``move(record, name, now)`` applies one
    move and returns the new status, or false (the record keeps its status) when the move is
    not allowed from the current one."""
    rows = []
    for name, (sources, target) in TRANSITIONS.items():
        leaves = ", ".join(f"[{_lua(s)}] = true" for s in sorted(sources))
        rows.append(f"  [{_lua(name)}] = {{leaves = {{{leaves}}}, to = {_lua(target)}}},")
    return (
        "local TRANSITIONS = {\n" + "\n".join(rows) + "\n}\n"
        "local function move(record, name, now)\n"
        "  local t = TRANSITIONS[name]\n"
        "  local status = redis.call('HGET', record, 'status')\n"
        "  if not status or not t.leaves[status] then return false end\n"
        "  redis.call('HSET', record, 'status', t.to, 'updated_at', now)\n"
        "  return t.to\n"
        "end\n"
    )


def _lua(text: str) -> str:
    return json.dumps(text)
