"""Which queues have a live consumer (worker/host_queues.py says which a worker serves).

A run's sandbox lives in one place (a Docker daemon, or the machine of a local sandbox), so
its later turns must reach a worker there: the run record names that place's host queue.
Every worker refreshes, every few seconds, a key per queue it consumes (its harness queues
and its host queues) and a key of its own; when they lapse the worker is away. Producers use
this to say that a turn waits, the reaper to decide how long a turn has waited for a host.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from worker import lua
from worker.keys import Keys, RedisClient

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 5.0


def is_host_queue(queue: str, keys: Keys) -> bool:
    return queue.startswith(f"{keys.prefix}.host.")


def alive(client: RedisClient, keys: Keys, queue: str) -> bool:
    """True while some live worker consumes ``queue`` (any queue: harness or host)."""
    return bool(client.exists(keys.host_alive(queue)))


def beat_once(
    client: RedisClient,
    keys: Keys,
    queues: Iterable[str],
    host_queues_: Iterable[str],
    worker_id: str,
    ttl_s: float,
) -> None:
    ttl = max(int(ttl_s), 2)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.set(keys.host_alive(queue), worker_id, ex=ttl)
    for queue in host_queues_:
        pipe.hset(keys.hosts(), queue, worker_id)
    pipe.set(keys.worker_alive(worker_id), ",".join(sorted(set(queues))), ex=ttl)
    pipe.execute()


def start_heartbeat(
    client: RedisClient,
    keys: Keys,
    queues: Iterable[str],
    host_queues_: Iterable[str],
    worker_id: str,
    ttl_s: float,
) -> threading.Event:
    """Refresh the consumer keys of ``queues`` until the returned event is set; the first
    beat happens before this returns, so a producer sees the worker as soon as it consumes."""
    stop = threading.Event()
    consumed, hosted = tuple(queues), tuple(host_queues_)
    beat_once(client, keys, consumed, hosted, worker_id, ttl_s)

    def beat() -> None:
        while not stop.wait(BEAT_INTERVAL_S):
            try:
                beat_once(client, keys, consumed, hosted, worker_id, ttl_s)
            except Exception as exc:  # noqa: BLE001 -- Redis away: try again next beat
                log.warning("host.heartbeat_failed", extra={"error": str(exc)})

    threading.Thread(target=beat, name="host-heartbeat", daemon=True).start()
    return stop


def stop_heartbeat(client: RedisClient, keys: Keys, queues: Iterable[str], worker_id: str) -> None:
    """A worker leaving on purpose: drop its keys now, unless another worker refreshed them."""
    scripts = lua.scripts(client)
    for queue in queues:
        scripts.delete_if_mine(keys.host_alive(queue), worker_id)
    client.delete(keys.worker_alive(worker_id))
