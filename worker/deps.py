"""What a turn needs from its worker process: settings, Redis, the run store, sandboxes, the
places its sandboxes live, and the shutdown state."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from config import Settings
from sandbox.base import Sandbox
from worker.store.keys import Keys, SyncRedis
from worker.store.queued import SendTurn
from worker.store.records import RunStore


@dataclass
class Shutdown:
    """Set when the worker begins a warm shutdown; turns get ``grace_s`` to finish."""

    grace_s: float
    requested_at: float | None = None
    event: threading.Event = dataclasses.field(default_factory=threading.Event)
    active: int = 0
    _lock: threading.Condition = dataclasses.field(default_factory=threading.Condition)

    def request(self, *, immediate: bool = False) -> None:
        if immediate:
            self.grace_s = 0.0
        if self.requested_at is None:
            self.requested_at = time.monotonic()
        self.event.set()

    def enter(self) -> None:
        with self._lock:
            self.active += 1

    def leave(self) -> None:
        with self._lock:
            self.active -= 1
            self._lock.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no turn is in flight (used by a cold shutdown before the process exits)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.active == 0, timeout_s)

    def expired(self) -> bool:
        return self.requested_at is not None and (
            time.monotonic() - self.requested_at >= self.grace_s
        )


@dataclass
class TurnDeps:
    settings: Settings
    redis: SyncRedis
    keys: Keys
    store: RunStore
    sandbox_for: Callable[[str], Sandbox]
    worker_id: str
    shutdown: Shutdown
    host_queues: dict[str, str] = dataclasses.field(default_factory=dict)
    """Per sandbox backend, the queue of the place this worker's sandboxes live."""
    send_turn: SendTurn = dataclasses.field(default=lambda payload, queue, countdown: _no_broker())
    """How a turn is sent to the broker: ``worker.app.turn_sender`` of the worker's app."""
    end_run: Callable[[TurnDeps, str], bool] = dataclasses.field(
        default=lambda deps, run_id: _no_end_run()
    )
    """How a run is torn down (record ended, sandbox removed): ``worker.fleet.lifecycle.end_run``,
    for the runs a turn starts of its own (an outcome's grader: worker/outcomes/)."""


def _no_broker() -> None:
    raise RuntimeError("this process has no broker to send a turn to (TurnDeps.send_turn)")


def _no_end_run() -> bool:
    raise RuntimeError("this process cannot end a run (TurnDeps.end_run)")
