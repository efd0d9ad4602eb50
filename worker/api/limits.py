"""The API's limits: a request rate per tenant and wrong keys per client address (fixed
windows counted in Redis, shared by every API process), and open event streams per tenant
(counted by each process: a stream holds that process' memory and connection)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.store.keys import Keys


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    remaining: int
    retry_after_s: int
    """Whole seconds until the window resets (the ``Retry-After`` of a 429)."""


@dataclass
class _Window:
    redis: Any
    """A ``redis.asyncio.Redis``."""
    window_s: int
    clock: Callable[[], float]

    def current(self) -> tuple[int, int]:
        """The window's number, and whole seconds until the next one."""
        now = self.clock()
        window = int(now // self.window_s)
        return window, max(1, math.ceil((window + 1) * self.window_s - now))

    async def count(self, key: str) -> int:
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, self.window_s + 1)
        count, _ = await pipe.execute()
        return int(count)


@dataclass
class RateLimiter:
    """``HARNESS_API_RATE_LIMIT`` requests per tenant per ``HARNESS_API_RATE_WINDOW_S``."""

    redis: Any
    """A ``redis.asyncio.Redis``."""
    keys: Keys
    window_s: int
    clock: Callable[[], float] = time.time

    async def hit(self, tenant: str, limit: int) -> Verdict:
        """Count one request of ``tenant``; refused past ``limit`` in its window (0: none)."""
        if limit <= 0:
            return Verdict(True, 0, 0)
        windows = _Window(self.redis, self.window_s, self.clock)
        window, retry = windows.current()
        count = await windows.count(self.keys.tenant_key(tenant, f"rate:{window}"))
        if count > limit:
            return Verdict(False, 0, retry)
        return Verdict(True, limit - count, retry)


@dataclass
class FailedAuthLimiter:
    """At most ``limit`` requests with a wrong key per client address and window: past it
    every request of that address that bears a key is refused (429) until the window ends,
    a right key's too, so guessing gets no answer either way."""

    redis: Any
    """A ``redis.asyncio.Redis``."""
    keys: Keys
    window_s: int
    limit: int
    """0: no limit."""
    clock: Callable[[], float] = time.time

    def _key(self, address: str) -> tuple[str, int]:
        window, retry = _Window(self.redis, self.window_s, self.clock).current()
        return self.keys.api_client(address, f"auth-failures:{window}"), retry

    async def check(self, address: str) -> Verdict:
        """Whether ``address`` may try a key now."""
        if self.limit <= 0:
            return Verdict(True, 0, 0)
        key, retry = self._key(address)
        return self._verdict(await self.redis.get(key), retry)

    def ask(self, pipe: Any, address: str) -> Callable[..., Verdict]:
        """:meth:`check` as a read queued on ``pipe`` (one round trip with the others there),
        and what makes the verdict of that read's reply (of no reply when there is no
        limit: nothing is queued then)."""
        if self.limit <= 0:
            return lambda: Verdict(True, 0, 0)
        key, retry = self._key(address)
        pipe.get(key)
        return lambda failed: self._verdict(failed, retry)

    def _verdict(self, failed: Any, retry: int) -> Verdict:
        count = int(failed or 0)
        return Verdict(count < self.limit, max(0, self.limit - count), retry)

    async def failed(self, address: str) -> None:
        """Count one wrong key of ``address`` (its next :meth:`check` says whether it may try
        again)."""
        if self.limit > 0:
            await _Window(self.redis, self.window_s, self.clock).count(self._key(address)[0])


@dataclass
class StreamSlots:
    """Each tenant's open event streams on this process: at most ``most`` (0: no limit)."""

    most: int
    _open: Counter[str] = field(default_factory=Counter)

    def take(self, tenant: str) -> StreamSlot | None:
        """One of the tenant's slots, or None when all are taken. The check and the count
        are one step with no ``await`` between: on the event loop no other request runs in
        between, so streams opened at once never pass the check together."""
        if self.most > 0 and self._open[tenant] >= self.most:
            return None
        self._open[tenant] += 1
        return StreamSlot(self, tenant)

    def _give_back(self, tenant: str) -> None:
        self._open[tenant] -= 1
        if self._open[tenant] <= 0:
            del self._open[tenant]


@dataclass(eq=False)
class StreamSlot:
    """A stream's hold on one of its tenant's slots, from the route's check until
    :meth:`release` (which gives it back once, however often it is called)."""

    slots: StreamSlots
    tenant: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slots._give_back(self.tenant)
