"""Every Redis key name, in one place (CONTRACT.md, "Redis layout")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

#: A synchronous ``redis.Redis`` with ``decode_responses=True``. redis-py annotates every
#: command as ``Awaitable[T] | T`` (shared with its asyncio client), which turns correct
#: synchronous code into type errors, so the client is typed as Any at our seams.
SyncRedis: TypeAlias = Any


@dataclass(frozen=True)
class Keys:
    prefix: str = "harness"

    def run(self, run_id: str) -> str:
        """The run record (a hash)."""
        return f"{self.prefix}:run:{run_id}"

    def events(self, run_id: str) -> str:
        """The run's event stream; entry ids are ``{turn}-{seq}``."""
        return f"{self.prefix}:run:{run_id}:events"

    def transcript(self, run_id: str) -> str:
        """A list of the run's turns (input and final answer), replayed when resume fails."""
        return f"{self.prefix}:run:{run_id}:transcript"

    def turn_queued(self, run_id: str, turn: int) -> str:
        """The turn's payload while it waits to be taken: the reaper re-sends it from here if
        the broker loses its message (a worker killed while holding it)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:queued"

    def turn_started(self, run_id: str, turn: int) -> str:
        """Set once when a worker takes a turn: a redelivered turn never runs twice."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:started"

    def turn_owner(self, run_id: str, turn: int) -> str:
        """The owning worker's heartbeat (expires when it dies)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:owner"

    def cancel(self, run_id: str, turn: int) -> str:
        return f"{self.prefix}:run:{run_id}:turn:{turn}:cancel"

    def credential(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:credential"

    def run_keys(self, run_id: str) -> tuple[str, ...]:
        """Keys that share the run's retention."""
        return (self.run(run_id), self.events(run_id), self.transcript(run_id))

    def runs_index(self) -> str:
        """A set of run ids that may still hold a sandbox (for the reaper)."""
        return f"{self.prefix}:runs:active"

    def hosts(self) -> str:
        """A hash of every host queue a worker ever announced (for the reaper's fan-out)."""
        return f"{self.prefix}:hosts"

    def host_alive(self, queue: str) -> str:
        """Set, with a short expiry, while a live worker consumes this queue (a host queue or
        a harness queue)."""
        return f"{self.prefix}:host:{queue}"

    def worker_alive(self, worker_id: str) -> str:
        """Set, with a short expiry, while this worker process is up and consuming."""
        return f"{self.prefix}:worker:{worker_id}"

    def reaper_lock(self, scope: str) -> str:
        """Held by the worker running a reaper pass over ``scope`` (``fleet`` or a host
        queue), so that passes over the same things never overlap."""
        return f"{self.prefix}:reaper:{scope}"
