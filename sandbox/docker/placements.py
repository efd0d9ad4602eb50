"""The containers this sandbox has already seen running, so a run's next turn needs no lookup.

Asking the daemon for a run's container before every turn cost one API round trip (2-4 ms)
on the path of every turn. A run's container is instead remembered once a turn has started
in it; the next ``prepare`` of that run answers from memory, marked unverified, and the
turn's exec is the check: when it finds the container gone or stopped, the sandbox forgets
it, prepares the run the long way (restart, or a new container) and starts the turn again.
Bounded (least recently used first out): runs that ended on another worker are not told to us.

A container this sandbox has just created is remembered as *new* until its first exec: that
exec is the new container's check too (see :mod:`sandbox.docker.scripts`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

from sandbox.base import Placement, RunSpec

DEFAULT_CAPACITY = 4096


class KnownPlacements:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._known: OrderedDict[str, tuple[RunSpec, Placement]] = OrderedDict()
        self._unverified: dict[str, RunSpec] = {}
        self._new: set[str] = set()
        self._lock = threading.Lock()

    def remember(self, spec: RunSpec, placement: Placement, *, new: bool = False) -> None:
        """``placement`` is the run's container: a turn started in it, or (``new``) it was
        just created and no exec has checked it yet."""
        with self._lock:
            if new:
                self._new.add(spec.run_id)
            else:
                self._new.discard(spec.run_id)
            self._known[spec.run_id] = (_shape(spec), placement)
            self._known.move_to_end(spec.run_id)
            while len(self._known) > self._capacity:
                self._new.discard(self._known.popitem(last=False)[0])

    def lookup(self, spec: RunSpec) -> Placement | None:
        """The run's remembered placement for a run of this shape; unverified until started."""
        with self._lock:
            entry = self._known.get(spec.run_id)
            if entry is None or entry[0] != _shape(spec):
                return None
            self._known.move_to_end(spec.run_id)
            self._unverified[spec.run_id] = spec
            return entry[1]

    def take_unverified(self, run_id: str) -> RunSpec | None:
        """The spec of a placement ``lookup`` handed out and no exec has checked yet."""
        with self._lock:
            return self._unverified.pop(run_id, None)

    def take_new(self, run_id: str) -> bool:
        """Whether the run's container was just created and this is its first exec."""
        with self._lock:
            if run_id not in self._new:
                return False
            self._new.discard(run_id)
            return True

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._known.pop(run_id, None)
            self._unverified.pop(run_id, None)
            self._new.discard(run_id)


def _shape(spec: RunSpec) -> RunSpec:
    """The spec without its per-turn labels (the lease moves every turn)."""
    return replace(spec, labels={})
