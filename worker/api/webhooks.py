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

Sending is bounded, so that no receiver holds back another's deliveries: each attempt runs
on its own, within ``HARNESS_WEBHOOK_TIMEOUT_S`` in all (resolving, connecting, sending, the
reply's headers); at most ``HARNESS_WEBHOOK_CONCURRENCY`` are in flight on one API process,
``HARNESS_WEBHOOK_PER_TENANT`` of one tenant and ``HARNESS_WEBHOOK_PER_HOST`` to one host
(``host:port``), and a delivery over its tenant's or host's share waits behind the others
that are due. Of a reply, only the status and the first :data:`REPLY_READ_BYTES` of a
refusal are read (for the log). The connection goes to the address its host was checked at
(worker/api/outbound.py).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from adapters.events import TERMINAL_TYPES
from config import Settings
from sandbox.addresses import AddressRefused
from sandbox.store.seeding import SeedError, check_repo_url
from worker.api.outbound import webhook_client
from worker.api.tenants import Tenant, TenantRegistry
from worker.errors import InvalidInput
from worker.observe import metrics
from worker.store import stream_end
from worker.store.keys import Keys

log = logging.getLogger("worker.api.webhooks")

DELIVERED_TYPES = frozenset({*TERMINAL_TYPES, "permission-request"})
MAX_BACKOFF_S = 600.0
REPLY_READ_BYTES = 1024
"""Of a reply that is not a 2xx, what is read (and logged); nothing of a 2xx. The rest is
never read: a reply of any size costs a delivery no more memory than this."""
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


def check_url(url: str, settings: Settings, *, resolve: bool = True) -> str:
    """A webhook URL operator policy allows (HARNESS_WEBHOOK_SCHEMES, _HOSTS): a host not
    named there must resolve to public addresses only. Blocking when ``resolve`` (it looks
    the host up; a delivery does not: its connection checks the address it goes to)."""
    schemes = [s for s in settings.webhook_schemes if s in ("http", "https")]
    if len(url) > 2000:
        raise InvalidInput("invalid request: webhook_url: longer than 2000 characters")
    try:
        check_repo_url(url, schemes, settings.webhook_hosts, resolve=resolve)
    except SeedError as exc:
        text = str(exc).replace("the repository URL", "the webhook URL")
        raise InvalidInput(
            f"webhook_url refused: {text} (operator policy HARNESS_WEBHOOK_SCHEMES, "
            "HARNESS_WEBHOOK_HOSTS)"
        ) from None
    return url


def client(settings: Settings) -> httpx.AsyncClient:
    """The API's HTTP client for deliveries (worker/api/outbound.py)."""
    http: httpx.AsyncClient = webhook_client(
        settings.webhook_hosts, connections=settings.webhook_concurrency
    )
    return http


@dataclass(frozen=True)
class _Target:
    """A due delivery, and where it goes."""

    msg_id: str
    delivery: dict[str, Any]
    url: str
    tenant: Tenant

    @property
    def host(self) -> str:
        parts = urlsplit(self.url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 0)
        return f"{(parts.hostname or '').lower()}:{port}"


@dataclass
class Dispatcher:
    """The API process' webhook scanner and sender (:meth:`run` is its task)."""

    redis: Any
    """A ``redis.asyncio.Redis`` (the API's shared pool)."""
    keys: Keys
    tenants: TenantRegistry
    settings: Settings
    http: httpx.AsyncClient
    """The client deliveries go through: :func:`client`'s."""
    clock: Callable[[], float] = time.time
    draining: bool = False
    """The process is shutting down: no delivery starts (:meth:`finish`)."""
    _sending: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    _per_tenant: Counter[str] = field(default_factory=Counter)
    _per_host: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._claim = self.redis.register_script(_CLAIM)

    async def watch(self, run_id: str) -> None:
        await self.redis.sadd(self.keys.webhooks("runs"), run_id)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.scan()
                    await self.send_due()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 -- the task outlives any one fault; said, retried
                    log.warning("webhook.pass_failed", extra={"error": repr(exc)})
                await asyncio.sleep(self.settings.webhook_poll_s)
        finally:
            # Deliveries cut short here are due again when their lease runs out.
            for task in self._sending.values():
                task.cancel()
            await asyncio.gather(*self._sending.values(), return_exceptions=True)

    async def finish(self, within_s: float) -> None:
        """Shutting down: start no delivery, and give those in flight up to ``within_s``
        seconds to end (the task's cancellation cuts the others short: due again when their
        lease runs out)."""
        self.draining = True
        if self._sending and within_s > 0:
            await asyncio.wait(list(self._sending.values()), timeout=within_s)

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
        """Start the deliveries that are due, as many as there are free slots (the module's
        docstring says which); returns how many were started. Each goes on in a task of its
        own: none waits for another."""
        settings = self.settings
        free = settings.webhook_concurrency - len(self._sending)
        if free <= 0 or self.draining:
            return 0
        now = self.clock()
        # Past those that must wait for their tenant's or host's slots, to others' behind.
        window = free + settings.webhook_concurrency
        due = [
            msg_id
            for msg_id in await self.redis.zrangebyscore(
                self.keys.webhooks("due"), "-inf", now, 0, window
            )
            if msg_id not in self._sending
        ]
        started = 0
        for target in await self._targets(due):
            if len(self._sending) >= settings.webhook_concurrency:
                break
            tenant, host = target.tenant.name, target.host
            if (
                self._per_tenant[tenant] >= settings.webhook_per_tenant
                or self._per_host[host] >= settings.webhook_per_host
            ):
                # Its turn comes once one of its tenant's or host's deliveries ends; meanwhile
                # it steps behind the others due (claimed for one poll, not sent).
                await self._claim(
                    keys=[self.keys.webhooks("due")],
                    args=[target.msg_id, now, now + settings.webhook_poll_s],
                )
                continue
            if not await self._claim(
                keys=[self.keys.webhooks("due")],
                args=[target.msg_id, now, now + settings.webhook_lease_s],
            ):
                continue
            self._per_tenant[tenant] += 1
            self._per_host[host] += 1
            task = asyncio.create_task(self._send(target), name=f"webhook {target.msg_id}")
            self._sending[target.msg_id] = task
            task.add_done_callback(functools.partial(self._sent, target))
            started += 1
        return started

    def _sent(self, target: _Target, task: asyncio.Task[bool]) -> None:
        self._sending.pop(target.msg_id, None)
        for counts, key in ((self._per_tenant, target.tenant.name), (self._per_host, target.host)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "webhook.send_failed",
                extra={"webhook_id": target.msg_id, "error": repr(task.exception())},
            )

    async def _targets(self, due: list[str]) -> list[_Target]:
        """The deliveries ``due`` names, with their URL and tenant; those with neither any
        more (the run's record or tenant gone, the tenant revoked) dropped."""
        if not due:
            return []
        texts = await self.redis.hmget(self.keys.webhooks("body"), due)
        deliveries = {m: json.loads(t) for m, t in zip(due, texts, strict=True) if t is not None}
        for msg_id in set(due) - set(deliveries):
            await self.redis.zrem(self.keys.webhooks("due"), msg_id)
        runs = sorted({d["run_id"] for d in deliveries.values()})
        pipe = self.redis.pipeline(transaction=False)
        for run_id in runs:
            pipe.hmget(self.keys.run(run_id), ["webhook_url", "tenant"])
        records = dict(zip(runs, await pipe.execute(), strict=True))
        targets = []
        for msg_id, delivery in deliveries.items():
            url, tenant_name = records[delivery["run_id"]]
            tenant = self.tenants.get(tenant_name) if tenant_name else None
            url = url or (tenant.webhook_url if tenant else None)
            if tenant is None or tenant.revoked or not url:
                await self._drop(msg_id, "no tenant or URL")
                continue
            targets.append(_Target(msg_id, delivery, url, tenant))
        return targets

    async def _send(self, target: _Target) -> bool:
        """One attempt at one delivery, bounded in time and in what it reads; True on a
        2xx (the delivery is done), else it is retried or dropped."""
        msg_id, delivery, url = target.msg_id, target.delivery, target.url
        try:
            check_url(url, self.settings, resolve=False)  # policy may have changed since
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
            "webhook-signature": sign(target.tenant.webhook_secret, msg_id, timestamp, body),
        }
        timeout = self.settings.webhook_timeout_s
        try:
            async with asyncio.timeout(timeout):
                async with self.http.stream(
                    "POST", url, content=body, headers=headers, timeout=timeout
                ) as response:
                    ok = 200 <= response.status_code < 300
                    why = f"status {response.status_code}"
                    if not ok:
                        why += f": {await _head(response)!r}"
        except AddressRefused as exc:
            metrics.webhook_delivered("refused")
            await self._drop(msg_id, f"webhook_url refused: {exc}")
            return False
        except TimeoutError:
            ok, why = False, f"no reply within HARNESS_WEBHOOK_TIMEOUT_S ({timeout:g} s)"
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


async def _head(response: httpx.Response) -> bytes:
    """At most :data:`REPLY_READ_BYTES` of a reply's body, as sent (never decompressed)."""
    head = b""
    async for chunk in response.aiter_raw():
        head += chunk[: REPLY_READ_BYTES - len(head)]
        if len(head) >= REPLY_READ_BYTES:
            break
    return head
