"""What a silent harness is doing: its last event and how long ago, the processes in its
sandbox (state, CPU time) and their open connections.

The read loop (:mod:`worker.turn.attempt`) asks for it when an idle or turn timeout fires
(the ``session-error`` says it, and the log), and tells it the time of the last output on
every pass: a turn silent for ``HARNESS_STALL_REPORT_S`` has it written to Redis, again at
that interval while the silence lasts, for ``harness status`` (``silent_turn``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from sandbox.base import Inspect, Sandbox, SandboxError
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis

log = logging.getLogger(__name__)

REPORT_TTL_FACTOR = 3
"""A written report outlives its interval this many times over (then the turn is not silent,
or it is over)."""

LastEvent = Callable[[], tuple[str, float] | None]
"""The type and monotonic time of the turn's last published event, if any."""


class Stall:
    """The diagnosis of one turn's harness; cheap to ask while it is not silent."""

    def __init__(
        self,
        sandbox: Sandbox,
        run_id: str,
        turn: int,
        last_event: LastEvent,
        *,
        redis: SyncRedis,
        keys: Keys,
        report_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sandbox, self.run_id, self.turn = sandbox, run_id, turn
        self.last_event = last_event
        self.redis, self.keys = redis, keys
        self.report_after_s = report_after_s
        self.clock = clock
        self.next_report = 0.0

    def describe(self, last_output: float) -> str:
        """What the harness was doing, as text (several lines); logged as ``turn.stalled``."""
        facts = self.facts(last_output)
        log.warning("turn.stalled", extra={"run_id": self.run_id, "turn": self.turn, **facts})
        return f"{facts['activity']}\n{facts['processes']}"

    def facts(self, last_output: float) -> dict[str, str | float | None]:
        now = self.clock()
        last = self.last_event()
        if last is None:
            activity = "no event yet"
            kind, ago = None, None
        else:
            kind, ago = last[0], round(now - last[1], 1)
            activity = f"the last event was {kind}, {ago:g}s ago"
        silent = round(now - last_output, 1)
        return {
            "activity": f"{activity}; the last output {silent:g}s ago",
            "last_event": kind,
            "last_event_s": ago,
            "silent_s": silent,
            "processes": self._processes(),
        }

    def _processes(self) -> str:
        if not isinstance(self.sandbox, Inspect):
            return f"the {self.sandbox.backend} sandbox cannot list its processes"
        try:
            return self.sandbox.processes(self.run_id).describe()
        except SandboxError as exc:
            return f"the sandbox's processes could not be listed: {exc}"

    def watch(self, last_output: float) -> None:
        """Told on every pass of the read loop: write the report once the turn has been
        silent for ``report_after_s`` (0: never), then at that interval."""
        if self.report_after_s <= 0:
            return
        now = self.clock()
        if now - last_output < self.report_after_s or now < self.next_report:
            return
        self.next_report = now + self.report_after_s
        facts = self.facts(last_output)
        log.info("turn.silent", extra={"run_id": self.run_id, "turn": self.turn, **facts})
        report = {"turn": self.turn, "at": time.time(), **facts}
        try:
            self.redis.set(
                self.keys.turn_silent(self.run_id, self.turn),
                json.dumps(report),
                ex=max(1, int(self.report_after_s * REPORT_TTL_FACTOR)),
            )
        except REDIS_ERRORS as exc:
            log.warning("turn.silent_unrecorded", extra={"run_id": self.run_id, "error": str(exc)})


def read_report(redis: SyncRedis, keys: Keys, run_id: str, turn: int) -> dict[str, object] | None:
    """The last report of a silent turn, while it is fresh."""
    text = redis.get(keys.turn_silent(run_id, turn))
    return json.loads(text) if text else None
