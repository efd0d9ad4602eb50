"""Webhooks: a run's terminal events, permission requests and end, POSTed to its
``webhook_url`` (or its tenant's), signed as Standard Webhooks does.

Durable in Redis (``Keys.webhooks``): the API watches the runs that have a URL (``runs``),
scans their streams from a stored cursor (``cursor``) and queues a delivery per event it
delivers, by an id made of the run and the entry (``body``, ``due``: ``ZADD NX``, so two API
processes queue it once). A run is let go, its end (``run-ended``) queued, only once its
stream has ended and the scan has reached that end (worker/store/stream_end.py). A delivery
is claimed by moving its due time a lease ahead, and dropped on a 2xx; otherwise it is due
again after a backoff (doubling, up to 10 minutes), for ``HARNESS_WEBHOOK_RETRY_FOR_S``. A
process that dies holding one leaves it due again when the lease runs out: the next API
process delivers it, with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool

from adapters.events import TERMINAL_TYPES
from config import Settings
from sandbox.store.seeding import SeedError, check_repo_url
from worker.api.tenants import TenantRegistry
from worker.errors import InvalidInput
from worker.observe import metrics
from worker.store import stream_end
from worker.store.keys import Keys

log = logging.getLogger("worker.api.webhooks")

DELIVERED_TYPES = frozenset({*TERMINAL_TYPES, "permission-request"})
MAX_BACKOFF_S = 600.0
SCAN_COUNT = 500
"""Entries read per run per pass: a long stream is scanned over several passes, and its run
is let go only once the scan has reached the stream's end (worker/store/stream_end.py)."""


_CLAIM = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if due and tonumber(due) <= tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
return 0
"""


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,`` and the base64 HMAC-SHA256, keyed by the
    secret's bytes (the base64 after ``whsec_``), of ``id.timestamp.body``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def check_url(url: str, settings: Settings) -> str:
    """A webhook URL operator policy allows (HARNESS_WEBHOOK_SCHEMES, _HOSTS): a host not
    named there must resolve to public addresses only. Blocking (it resolves the host)."""
    schemes = [s for s in settings.webhook_schemes if s in ("http", "https")]
    if len(url) > 2000:
        raise InvalidInput("invalid request: webhook_url: longer than 2000 characters")
    try:
        check_repo_url(url, schemes, settings.webhook_hosts)
    except SeedError as exc:
        text = str(exc).replace("the repository URL", "the webhook URL")
        raise InvalidInput(
            f"webhook_url refused: {text} (operator policy HARNESS_WEBHOOK_SCHEMES, "
            "HARNESS_WEBHOOK_HOSTS)"
        ) from None
    return url


@dataclass
class Dispatcher:
    """The API process' webhook scanner and sender (:meth:`run` is its task)."""

    redis: Any
    """A ``redis.asyncio.Redis`` (the API's shared pool)."""
    keys: Keys
    tenants: TenantRegistry
    settings: Settings
    http: httpx.AsyncClient
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._claim = self.redis.register_script(_CLAIM)

    async def watch(self, run_id: str) -> None:
        await self.redis.sadd(self.keys.webhooks("runs"), run_id)

    async def run(self) -> None:
        while True:
            try:
                await self.scan()
                await self.send_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- the task outlives any one fault; said, retried
                log.warning("webhook.pass_failed", extra={"error": repr(exc)})
            await asyncio.sleep(self.settings.webhook_poll_s)

    async def scan(self) -> None:
        """Queue a delivery for each new event to deliver of every watched run."""
        runs = sorted(await self.redis.smembers(self.keys.webhooks("runs")))
        for start in range(0, len(runs), 256):
            await self._scan(runs[start : start + 256])

    async def _scan(self, runs: list[str]) -> None:
        """One pass over ``runs``: their new entries (up to :data:`SCAN_COUNT` each) queued
        for delivery, and each run whose stream has ended and been scanned to its end let go,
        its end delivered after every event of it."""
        cursors = await self.redis.hmget(self.keys.webhooks("cursor"), runs)
        # Where each stream ends, if it has (read before the streams: stream_end.py).
        pipe = self.redis.pipeline(transaction=False)
        for run_id in runs:
            stream_end.ask(pipe, self.keys, run_id)
        replies = await pipe.execute()
        statuses, newest = replies[0::2], replies[1::2]
        ends = [stream_end.end_of(s, n) for s, n in zip(statuses, newest, strict=True)]
        read = {r: c or stream_end.START for r, c in zip(runs, cursors, strict=True)}
        streams = {self.keys.events(r): read[r] for r in runs}
        reply = await self.redis.xread(streams, count=SCAN_COUNT)
        by_key = {self.keys.events(r): r for r in runs}
        for key, entries in reply or ():
            run_id = by_key[key]
            for entry_id, fields in entries:
                if fields.get("type") in DELIVERED_TYPES:
                    data = json.loads(fields.get("data", "null"))
                    await self.enqueue(
                        f"msg_{run_id}_{entry_id}",
                        run_id,
                        fields["type"],
                        {"run_id": run_id, "event_id": entry_id, "event": data},
                    )
            read[run_id] = entries[-1][0]
            await self.redis.hset(self.keys.webhooks("cursor"), run_id, read[run_id])
        for run_id, status, end in zip(runs, statuses, ends, strict=True):
            if end is not None and stream_end.reached(read[run_id], end):
                await self._ended(run_id, status)

    async def _ended(self, run_id: str, status: str | None) -> None:
        """The run's stream has ended and every entry of it is queued: its end is delivered
        (unless its record is gone: nothing to deliver to) and the run let go."""
        if status is not None:
            await self.enqueue(
                f"msg_{run_id}_end", run_id, "run-ended", {"run_id": run_id, "status": status}
            )
        await self._forget(run_id)

    async def _forget(self, run_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.srem(self.keys.webhooks("runs"), run_id)
        pipe.hdel(self.keys.webhooks("cursor"), run_id)
        await pipe.execute()

    async def enqueue(self, msg_id: str, run_id: str, kind: str, data: dict[str, Any]) -> None:
        now = self.clock()
        body = {"run_id": run_id, "type": kind, "data": data, "first_at": now, "attempts": 0}
        if await self.redis.hsetnx(self.keys.webhooks("body"), msg_id, json.dumps(body)):
            await self.redis.zadd(self.keys.webhooks("due"), {msg_id: now}, nx=True)

    async def send_due(self) -> int:
        """Send the deliveries that are due; returns how many got a 2xx."""
        now = self.clock()
        due = await self.redis.zrangebyscore(self.keys.webhooks("due"), "-inf", now, 0, 50)
        claimed = [
            msg_id
            for msg_id in due
            if await self._claim(
                keys=[self.keys.webhooks("due")],
                args=[msg_id, now, now + self.settings.webhook_lease_s],
            )
        ]
        results = await asyncio.gather(*(self._send(msg_id) for msg_id in claimed))
        return sum(results)

    async def _send(self, msg_id: str) -> bool:
        text = await self.redis.hget(self.keys.webhooks("body"), msg_id)
        if text is None:
            await self.redis.zrem(self.keys.webhooks("due"), msg_id)
            return False
        delivery = json.loads(text)
        run_id = delivery["run_id"]
        url, tenant_name = await self.redis.hmget(self.keys.run(run_id), ["webhook_url", "tenant"])
        tenant = self.tenants.get(tenant_name) if tenant_name else None
        url = url or (tenant.webhook_url if tenant else None)
        if tenant is None or tenant.revoked or not url:
            await self._drop(msg_id, "no tenant or URL")
            return False
        try:
            await run_in_threadpool(check_url, url, self.settings)
        except InvalidInput as exc:
            metrics.webhook_delivered("refused")
            await self._drop(msg_id, str(exc))
            return False
        timestamp = int(self.clock())
        payload = {
            "type": delivery["type"],
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp)),
            "data": delivery["data"],
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(tenant.webhook_secret, msg_id, timestamp, body),
        }
        try:
            response = await self.http.post(
                url, content=body, headers=headers, timeout=self.settings.webhook_timeout_s
            )
            ok = 200 <= response.status_code < 300
            why = f"status {response.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, repr(exc)
        metrics.webhook_delivered("delivered" if ok else "failed")
        if ok:
            pipe = self.redis.pipeline(transaction=True)
            pipe.zrem(self.keys.webhooks("due"), msg_id)
            pipe.hdel(self.keys.webhooks("body"), msg_id)
            await pipe.execute()
            return True
        await self._retry(msg_id, delivery, why)
        return False

    async def _retry(self, msg_id: str, delivery: dict[str, Any], why: str) -> None:
        now = self.clock()
        if now - delivery["first_at"] >= self.settings.webhook_retry_for_s:
            await self._drop(msg_id, f"gave up after {delivery['attempts'] + 1} attempts: {why}")
            return
        delivery["attempts"] += 1
        delay = min(
            self.settings.webhook_backoff_s * 2 ** (delivery["attempts"] - 1), MAX_BACKOFF_S
        )
        await self.redis.hset(self.keys.webhooks("body"), msg_id, json.dumps(delivery))
        await self.redis.zadd(self.keys.webhooks("due"), {msg_id: now + delay})
        log.info("webhook.retry", extra={"webhook_id": msg_id, "in_s": delay, "why": why})

    async def _drop(self, msg_id: str, why: str) -> None:
        log.warning("webhook.dropped", extra={"webhook_id": msg_id, "why": why})
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(self.keys.webhooks("due"), msg_id)
        pipe.hdel(self.keys.webhooks("body"), msg_id)
        await pipe.execute()
