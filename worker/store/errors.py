"""The Redis errors that mean "Redis is away for now": ridden out, retried, or reported as
``Unavailable``; never a bug of ours."""

from __future__ import annotations

import redis

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
