"""Which Docker hosts have a live worker: a heartbeat key per host queue.

A run's container lives on one host, so its later turns must reach a worker there. Each
worker refreshes ``<prefix>:host:<queue>`` every few seconds; when it lapses, turns routed to
that queue would wait forever, so producers are refused at once and queued turns are closed
by the reaper with a ``sandbox`` error.
"""

from __future__ import annotations

import logging
import threading

from worker.keys import Keys, SyncRedis

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 5.0


def is_host_queue(queue: str, keys: Keys) -> bool:
    return queue.startswith(f"{keys.prefix}.host.")


def alive(client: SyncRedis, keys: Keys, queue: str) -> bool:
    return bool(client.exists(keys.host_alive(queue)))


def start_heartbeat(
    client: SyncRedis, keys: Keys, queue: str, worker_id: str, ttl_s: float
) -> threading.Event:
    """Refresh this host's heartbeat until the returned event is set."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            try:
                pipe = client.pipeline(transaction=False)
                pipe.set(keys.host_alive(queue), worker_id, ex=max(int(ttl_s), 2))
                pipe.hset(keys.hosts(), queue, worker_id)
                pipe.execute()
            except Exception as exc:  # noqa: BLE001 -- Redis away: try again next beat
                log.warning("host.heartbeat_failed", extra={"queue": queue, "error": str(exc)})
            stop.wait(BEAT_INTERVAL_S)

    threading.Thread(target=beat, name="host-heartbeat", daemon=True).start()
    return stop
