"""Which queues have a live consumer (worker/fleet/host_queues.py says which a worker serves).

A run's sandbox lives in one place (a Docker daemon, or the machine of a local sandbox), so
its later turns must reach a worker there: the run record names that place's host queue.
Every worker refreshes, every few seconds, a key per queue it consumes (its harness queues,
its host queues and their legacy names) and a key of its own; when they lapse the worker is
away. A run record naming a host queue's legacy name (one placed before host queue names
were shortened) therefore finds its host alive while a worker there runs. Producers use
this to say that a turn waits, the reaper to decide how long a turn has waited for a host.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from worker.store import lua
from worker.store.keys import Keys, RedisClient

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 5.0


def is_host_queue(queue: str, keys: Keys) -> bool:
    return queue.startswith(f"{keys.prefix}.host.")


def alive(client: RedisClient, keys: Keys, queue: str) -> bool:
    """True while some live worker consumes ``queue`` (any queue: harness or host)."""
    return bool(client.exists(keys.host_alive(queue)))


@dataclass
class Heartbeat:
    """A worker's consumer keys: one per queue it consumes (``queues``, legacy host queues
    included), one of its own, and its host queues in the hosts hash (for beat's fan-out;
    the current names only, one reap per host is enough), refreshed every few seconds."""

    client: RedisClient
    keys: Keys
    worker_id: str
    queues: tuple[str, ...]
    host_queues: tuple[str, ...]
    ttl_s: float
    _stop: threading.Event = field(default_factory=threading.Event)

    def beat(self) -> None:
        ttl = max(int(self.ttl_s), 2)
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.set(self.keys.host_alive(queue), self.worker_id, ex=ttl)
        for queue in self.host_queues:
            pipe.hset(self.keys.hosts(), queue, self.worker_id)
        pipe.set(self.keys.worker_alive(self.worker_id), ",".join(self.queues), ex=ttl)
        pipe.execute()

    def start(self) -> None:
        """Beat now (a producer sees the worker as soon as it consumes), then on a thread."""
        self.beat()

        def loop() -> None:
            while not self._stop.wait(BEAT_INTERVAL_S):
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 -- Redis away: try again next beat
                    log.warning("host.heartbeat_failed", extra={"error": str(exc)})

        threading.Thread(target=loop, name="host-heartbeat", daemon=True).start()

    def stop(self) -> None:
        """A worker leaving on purpose: drop its keys now, unless another worker of the same
        queue refreshed them meanwhile."""
        self._stop.set()
        scripts = lua.scripts(self.client)
        for queue in self.queues:
            scripts.delete_if_mine(self.keys.host_alive(queue), self.worker_id)
        self.client.delete(self.keys.worker_alive(self.worker_id))
