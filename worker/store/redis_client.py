"""The Redis client every part of ours uses (producers and workers alike)."""

from __future__ import annotations

from typing import cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from config import Settings
from worker.errors import InvalidSettings
from worker.store.keys import SyncRedis


def redis_client(settings: Settings) -> SyncRedis:
    # One immediate retry (a pooled connection gone stale after a Redis restart), no backoff:
    # the turn loop runs its checks every 0.2 s (and asks Redis on a ring or every 2 s) and
    # does its own retrying where it must (publishing, the run record); redis-py's default
    # backoff would stall it for seconds.
    try:
        client = redis.Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            socket_connect_timeout=5,
            socket_timeout=30,
            health_check_interval=15,
            retry=Retry(NoBackoff(), 1),
        )
    except ValueError as exc:  # redis-py parses the URL here: not a redis:// or unix:// URL
        raise InvalidSettings(f"invalid settings: HARNESS_REDIS_URL: {exc}") from None
    return cast(SyncRedis, client)
