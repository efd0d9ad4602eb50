"""Server-Sent Events for run streams: one reader per API process, fanned out to clients.

A thousand open streams cost neither a Redis connection nor a thread each: one
:class:`StreamHub` task reads every watched run stream with ``XREAD`` (one connection, the
stream keys in batches of ``HARNESS_API_READ_BATCH``) and puts each entry on the asyncio
queue of every client of that run. A run the hub starts watching is read at once: while the
hub waits in ``XREAD BLOCK`` on other runs, an entry in its own wake stream (one more key of
that read) ends the wait. A client first reads what it missed (``XRANGE`` from
its ``Last-Event-ID``, on the API's small shared pool) up to where the hub is, then takes
the hub's entries: no gap, no duplicate. The hub looks at the runs' records every second,
and ends a run's client streams once the run has ended and the hub has read its stream to
the end (:mod:`worker.store.stream_end`, the one rule of every follower: no grace period).

One run's fault stays that run's: a Redis error on one stream key (a reply error, not a lost
connection) ends that run's streams, logged, and the reader goes on with the others. Redis
out of reach (a lost connection) ends every stream of the process with a comment saying so
and a ``retry:`` hint: the client reconnects with its ``Last-Event-ID``, to a 503 until Redis
is back. A stream also ends when its key (or page link) stops authenticating (revoked,
rotated away, expired), checked every few seconds, and a tenant holds at most
``HARNESS_API_STREAMS_PER_TENANT`` streams of a process at once. When the process shuts down
(:meth:`StreamHub.drain`), every stream ends at once with a ``retry:`` hint and a comment:
the client resumes on another process after its last id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from worker.api.limits import StreamSlot
from worker.observe import metrics
from worker.store import stream_end
from worker.store.errors import REDIS_ERRORS
from worker.store.event_ids import START, EventId, parse_event_id
from worker.store.keys import Keys

UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)
"""What says Redis is out of reach (a refused or reset connection is an OSError too)."""

log = logging.getLogger("worker.api.sse")

Entry = tuple[str, str, str]
"""An event as the stream holds it: its id, its type and its data (JSON text)."""


@dataclass(frozen=True)
class Ending:
    """Why a client's stream ends, as its last words: a comment and, when the client should
    come back, a ``retry:`` (milliseconds) for an ``EventSource`` to wait before it does."""

    comment: str = ""
    retry_ms: int | None = None
    event: str | None = None
    """A last SSE event (no id: it is not an entry of the run's stream), for a client to act
    on where a comment would go unseen."""

    def text(self) -> str:
        retry = f"retry: {self.retry_ms}\n" if self.retry_ms is not None else ""
        said = f"{retry}: {self.comment}\n\n" if self.comment or retry else ""
        if self.event is not None:
            said += f"event: {self.event}\ndata: {json.dumps({'reason': self.comment})}\n\n"
        return said


_END = Ending()
"""The run has ended: the stream just closes."""
BEHIND = Ending("the client fell too far behind; reconnect with Last-Event-ID", 1000)
DRAINING = Ending("the server is shutting down; reconnect with Last-Event-ID", 1000)
UNREACHABLE = Ending("Redis cannot be reached; reconnect with Last-Event-ID", 5000)
REVOKED = Ending("the key no longer authenticates")
LOST = Ending(
    "the run is gone from Redis without its end (Redis lost its data)", event="stream-lost"
)
QUEUE_MAX = 10_000
"""Entries a client may fall behind by; past it its stream is closed with :data:`BEHIND`
(it resumes with ``Last-Event-ID``) rather than held in memory."""
WAKE_TTL_S = 3600
"""How long a hub's wake stream outlives its last wake (the hub removes it when it stops; this
is for one that died)."""
RECHECK_S = 5.0
"""At most this long between two checks that a stream's key still authenticates (or the
keep-alive interval, when shorter)."""


def format_event(entry: Entry) -> str:
    """One SSE message: ``id:``, ``event:`` and ``data:`` lines (a data line per line of
    the JSON, which has none unless a producer's tool wrote them)."""
    entry_id, kind, data = entry
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"id: {entry_id}\nevent: {kind}\n{lines}\n"


@dataclass(eq=False)
class Subscription:
    run_id: str
    key: str
    queue: asyncio.Queue[Entry | Ending]
    after: EventId
    """Entries up to this id were delivered before (skipped if the hub brings them)."""
    upto: str | None
    """The client reads its backlog, after ``after`` up to this id, itself; the hub's queue
    has what comes after it. None: no backlog."""


@dataclass(eq=False)
class _Run:
    key: str
    cursor: str
    subscribers: set[Subscription] = field(default_factory=set)
    end: str | None = None
    """Where the run's stream ends, once the run has ended: its client streams close when
    the hub's cursor reaches it."""
    lost: bool = False
    """The run is gone without its end (:func:`worker.store.stream_end.lost`): its streams
    end with :data:`LOST` rather than quietly."""


class StreamHub:
    """The process' one reader of run streams (:meth:`run` is its task)."""

    def __init__(
        self,
        reader: Any,
        pool: Any,
        keys: Keys,
        *,
        batch: int = 256,
        block_ms: int = 250,
        check_every_s: float = 1.0,
    ) -> None:
        self.reader = reader
        """A ``redis.asyncio.Redis`` of one connection, the hub's own (it blocks on XREAD)."""
        self.pool = pool
        """The API's shared ``redis.asyncio.Redis`` (a client's backlog)."""
        self.keys = keys
        self.batch = batch
        self.block_ms = block_ms
        self.check_every_s = check_every_s
        self._runs: dict[str, _Run] = {}
        self._by_key: dict[str, str] = {}
        self._wake = asyncio.Event()
        """Set once a run was added since the hub last took its list of runs."""
        self._wake_key = keys.hub_wake(uuid.uuid4().hex)
        self._wake_cursor = str(START)
        self._parked = False
        """The hub's XREAD BLOCK was sent (or is about to be) without the runs added since."""
        self._next_check = 0.0
        self.draining = False
        """Set by :meth:`drain`: every stream is ending, no new one starts."""

    @property
    def clients(self) -> int:
        return sum(len(run.subscribers) for run in self._runs.values())

    async def subscribe(self, run_id: str, after: EventId) -> Subscription:
        """A client of ``run_id``'s stream from after ``after`` (START: the start)."""
        added = False
        run = self._runs.get(run_id)
        if run is None:
            key = self.keys.events(run_id)
            newest = await self.pool.xrevrange(key, count=1)
            run = self._runs.get(run_id)
            if run is None:  # still untracked after the read: the hub goes on from the end
                # (never from a client's id: one client's id beyond the end must not make the
                # hub skip what the run's other clients are owed; the client skips it itself)
                end = newest[0][0] if newest else str(START)
                run = _Run(key, end)
                self._runs[run_id] = run
                self._by_key[key] = run_id
                added = True
        # The hub delivers what comes after its cursor; what lies between the client's id
        # and that cursor the client reads itself (it joins the queue first, so nothing the
        # hub reads meanwhile is lost).
        upto = run.cursor if after < parse_event_id(run.cursor) else None
        sub = Subscription(run_id, run.key, asyncio.Queue(QUEUE_MAX), after, upto)
        run.subscribers.add(sub)
        metrics.event_stream_opened()
        if added:
            await self._nudge()
        return sub

    async def _nudge(self) -> None:
        """Have the hub read the runs added since it last took its list now. Parked in XREAD
        BLOCK, it is woken by an entry in its wake stream: one that reaches Redis before the
        XREAD does ends it as well (a ``CLIENT UNBLOCK`` would be lost then)."""
        if self._wake.is_set():
            return  # woken already: its next pass takes every run added until then
        self._wake.set()
        if not self._parked:
            return
        pipe = self.pool.pipeline()  # MULTI: never a wake stream without its expiry
        pipe.xadd(self._wake_key, {"wake": "1"}, maxlen=1, approximate=False)
        pipe.expire(self._wake_key, WAKE_TTL_S)
        # Redis failing here fails the hub's read too: the hub ends every stream then.
        with contextlib.suppress(*UNREACHABLE_ERRORS):
            await pipe.execute()

    async def backlog(self, sub: Subscription) -> AsyncIterator[Entry]:
        """What the client missed, a page at a time (never a whole stream in memory)."""
        if sub.upto is None:
            return
        low = sub.after
        while True:
            entries = await self.pool.xrange(sub.key, min=f"({low}", max=sub.upto, count=1000)
            for entry_id, fields in entries:
                yield (entry_id, fields.get("type", ""), fields.get("data", "null"))
            if len(entries) < 1000:
                return
            low = entries[-1][0]

    def unsubscribe(self, sub: Subscription) -> None:
        run = self._runs.get(sub.run_id)
        if run is None or sub not in run.subscribers:
            return
        run.subscribers.discard(sub)
        metrics.event_stream_closed()
        if not run.subscribers:
            del self._runs[sub.run_id]
            self._by_key.pop(run.key, None)

    def drain(self) -> None:
        """The process is shutting down: every client's stream ends now (:data:`DRAINING`),
        and :func:`stream` starts no new one."""
        self.draining = True
        self._end_all(DRAINING)

    def _end_all(self, ending: Ending) -> None:
        for run in self._runs.values():
            for sub in list(run.subscribers):
                self._close(run, sub, ending)
        self._runs.clear()
        self._by_key.clear()

    async def run(self) -> None:
        """Read, fan out and end streams until cancelled. Redis out of reach ends every
        stream (:data:`UNREACHABLE`: their clients come back when it is); other faults are
        waited out."""
        try:
            while True:
                try:
                    await self._pass()
                except asyncio.CancelledError:
                    raise
                except UNREACHABLE_ERRORS as exc:
                    log.warning("sse.redis_unreachable", extra={"error": str(exc)})
                    self._end_all(UNREACHABLE)
                    self._wake_cursor = str(START)  # a restarted Redis may have lost its stream
                    await asyncio.sleep(1.0)
                except redis.RedisError as exc:
                    log.warning("sse.read_failed", extra={"error": str(exc)})
                    await asyncio.sleep(1.0)
                except Exception:  # the task's boundary: one pass's bug must not end every
                    log.exception("sse.hub_failed")  # stream of the process for good
                    await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(*UNREACHABLE_ERRORS, TimeoutError):
                await asyncio.wait_for(self.pool.delete(self._wake_key), 1.0)

    async def _pass(self) -> None:
        self._wake.clear()  # runs added from here on wake it (:meth:`_nudge`)
        if not self._runs:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the wait as a task of
            # its own, a turn of the loop more between a subscription and the hub's read.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.check_every_s):
                    await self._wake.wait()
            return
        streams = {run.key: run.cursor for run in self._runs.values()}
        keys = list(streams)
        # One batch blocks until something comes (or its wake stream says a run was added);
        # several are polled in turn.
        block = self.block_ms if len(keys) <= self.batch else None
        self._parked = block is not None
        got = False
        try:
            for start in range(0, len(keys), self.batch):
                chunk = {k: streams[k] for k in keys[start : start + self.batch]}
                if block is not None:
                    chunk[self._wake_key] = self._wake_cursor
                try:
                    reply = await self.reader.xread(chunk, count=500, block=block)
                except redis.ResponseError:  # a key Redis refuses: find it, read the others
                    reply = await self._read_each(chunk)
                for key, entries in reply or ():
                    got = got or bool(entries)
                    self._deliver(key, entries)
        finally:
            self._parked = False
        if not got and len(keys) > self.batch:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.block_ms / 1000 / 5):
                    await self._wake.wait()
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + self.check_every_s
            await self._end_finished()
        self._close_ended()

    async def _read_each(self, chunk: dict[str, str]) -> list[Any]:
        """The batch read key by key: a key Redis refuses ends its run's streams (logged)
        and leaves the hub; the others are read as usual."""
        replies: list[Any] = []
        for key, cursor in chunk.items():
            try:
                replies += await self.reader.xread({key: cursor}, count=500) or ()
            except redis.ResponseError as exc:
                self._drop(self._by_key.get(key), "sse.stream_failed", str(exc))
        return replies

    def _drop(self, run_id: str | None, event: str, error: str) -> None:
        """End every stream of the run and stop reading it."""
        run = self._runs.pop(run_id, None) if run_id else None
        if run is None:
            return
        log.warning(event, extra={"run_id": run_id, "error": error[:200]})
        self._by_key.pop(run.key, None)
        for sub in list(run.subscribers):
            self._close(run, sub)

    def _deliver(self, key: str, entries: list[tuple[str, dict[str, str]]]) -> None:
        if key == self._wake_key and entries:
            self._wake_cursor = entries[-1][0]
            return
        run_id = self._by_key.get(key)
        run = self._runs.get(run_id) if run_id else None
        if run is None:
            return
        for entry_id, fields in entries:
            entry = (entry_id, fields.get("type", ""), fields.get("data", "null"))
            run.cursor = entry_id
            for sub in list(run.subscribers):
                try:
                    sub.queue.put_nowait(entry)
                except asyncio.QueueFull:
                    self._close(run, sub, BEHIND)

    def _close(
        self, run: _Run, sub: Subscription, ending: Ending = _END, *, last: bool = False
    ) -> None:
        """End ``sub``'s stream with ``ending``. ``last``: the run has ended and the queue
        holds its last entries, which go first (the client would not come back for them);
        otherwise what it had not taken yet goes (the client reads it again after its last
        id), as it does when the queue is full."""
        if sub in run.subscribers:
            run.subscribers.discard(sub)
            metrics.event_stream_closed()
        if last and not sub.queue.full():
            sub.queue.put_nowait(ending)
            return
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(BEHIND if last else ending)

    async def _end_finished(self) -> None:
        """Where each run's stream ends, once it has (:mod:`worker.store.stream_end`)."""
        items = list(self._runs.items())
        pipe = self.reader.pipeline(transaction=False)
        for run_id, _ in items:
            stream_end.ask(pipe, self.keys, run_id)
        replies = await pipe.execute(raise_on_error=False)
        for at, (run_id, run) in enumerate(items):
            status, newest = replies[2 * at], replies[2 * at + 1]
            # Named by the key refused, not by which read met it first: a stream key made
            # bad while the hub waits in XREAD BLOCK on it is met here first.
            if isinstance(newest, redis.ResponseError):
                self._drop(run_id, "sse.stream_failed", str(newest))
                continue
            if isinstance(status, redis.ResponseError):
                self._drop(run_id, "sse.record_failed", str(status))
                continue
            run.end = stream_end.end_of(status, newest)
            run.lost = stream_end.lost(status, newest)

    def _close_ended(self) -> None:
        """End the client streams of every ended run the hub has read to its end."""
        for run_id, run in list(self._runs.items()):
            if run.end is not None and stream_end.reached(run.cursor, run.end):
                for sub in list(run.subscribers):
                    self._close(run, sub, LOST if run.lost else _END, last=True)
                self._runs.pop(run_id, None)
                self._by_key.pop(run.key, None)


@dataclass
class _Recheck:
    """Whether the stream's key still authenticates, asked at most every ``every_s``."""

    authorized: Callable[[], Awaitable[bool]]
    every_s: float
    due: float = 0.0
    ok: bool = True

    async def __call__(self) -> bool:
        now = time.monotonic()
        if self.ok and now >= self.due:
            self.due = now + self.every_s
            self.ok = await self.authorized()
        return self.ok


class SlotResponse(StreamingResponse):
    """An event stream that holds its tenant's stream slot, taken by the route as it
    answers, until the response is done, whichever way it ends: the stream ends, the client
    goes away, or its body is never read (a generator never started runs no ``finally``,
    this does)."""

    def __init__(self, content: AsyncIterator[str], slot: StreamSlot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
            body = self.body_iterator
            if isinstance(body, AsyncGenerator):  # its hub subscription goes now, not at GC
                await body.aclose()


async def stream(
    hub: StreamHub,
    run_id: str,
    after: EventId,
    *,
    tenant: str,
    authorized: Callable[[], Awaitable[bool]],
    keepalive_s: float,
    recheck_s: float = RECHECK_S,
) -> AsyncIterator[str]:
    """The SSE text of one client of ``tenant``: its backlog, then live entries, a comment
    when idle. It ends with the run; once ``authorized()`` (the request's key still names
    ``tenant``, or its page link is still live), asked at most every ``recheck_s``, says no;
    when Redis fails under it, and when the process shuts down (those two with a ``retry:``
    and a comment: the client resumes with its last id). Its tenant's stream slot is the
    response's (:class:`SlotResponse`), taken by the route before it answers."""
    if hub.draining:
        yield DRAINING.text()
        return
    still = _Recheck(authorized, min(keepalive_s, recheck_s))
    sub: Subscription | None = None
    try:
        sub = await hub.subscribe(run_id, after)
        seen = after
        yield ": stream open\n\n"
        async for entry in hub.backlog(sub):
            if hub.draining:
                yield DRAINING.text()
                return
            if not await still():
                break
            seen = parse_event_id(entry[0])
            yield format_event(entry)
        quiet_since = time.monotonic()
        while await still():
            try:  # a timeout, not wait_for: no task of its own per entry (Python 3.11)
                async with asyncio.timeout(still.every_s):
                    item = await sub.queue.get()
            except TimeoutError:
                if time.monotonic() - quiet_since >= keepalive_s:
                    quiet_since = time.monotonic()
                    yield ": keep-alive\n\n"
                continue
            if isinstance(item, Ending):
                if item.text():
                    yield item.text()
                return
            entry_id = parse_event_id(item[0])
            if entry_id <= seen:
                continue
            seen, quiet_since = entry_id, time.monotonic()
            yield format_event(item)
        log.info("sse.key_revoked", extra={"tenant": tenant, "run_id": run_id})
        yield REVOKED.text()
    except REDIS_ERRORS as exc:
        log.warning("sse.stream_unavailable", extra={"run_id": run_id, "error": str(exc)})
        yield UNREACHABLE.text()
    finally:
        if sub is not None:
            hub.unsubscribe(sub)
