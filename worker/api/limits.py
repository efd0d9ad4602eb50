"""A request rate limit per tenant: a fixed window counted in Redis, shared by every API
process (``HARNESS_API_RATE_LIMIT`` requests per ``HARNESS_API_RATE_WINDOW_S``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.store.keys import Keys


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    remaining: int
    retry_after_s: int
    """Whole seconds until the window resets (the ``Retry-After`` of a 429)."""


@dataclass
class RateLimiter:
    redis: Any
    """A ``redis.asyncio.Redis``."""
    keys: Keys
    window_s: int
    clock: Callable[[], float] = time.time

    async def hit(self, tenant: str, limit: int) -> Verdict:
        """Count one request of ``tenant``; refused past ``limit`` in its window (0: none)."""
        if limit <= 0:
            return Verdict(True, 0, 0)
        now = self.clock()
        window = int(now // self.window_s)
        key = self.keys.tenant_key(tenant, f"rate:{window}")
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, self.window_s + 1)
        count, _ = await pipe.execute()
        retry = max(1, math.ceil((window + 1) * self.window_s - now))
        if int(count) > limit:
            return Verdict(False, 0, retry)
        return Verdict(True, limit - int(count), retry)
