"""Server-Sent Events for run streams: one reader per API process, fanned out to clients.

A thousand open streams cost neither a Redis connection nor a thread each: one
:class:`StreamHub` task reads every watched run stream with ``XREAD`` (one connection, the
stream keys in batches of ``HARNESS_API_READ_BATCH``) and puts each entry on the asyncio
queue of every client of that run. A client first reads what it missed (``XRANGE`` from
its ``Last-Event-ID``, on the API's small shared pool) up to where the hub is, then takes
the hub's entries: no gap, no duplicate. The hub looks at the runs' records every second,
and ends a run's client streams once the run has ended and the hub has read its stream to
the end (:mod:`worker.store.stream_end`, the one rule of every follower: no grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis

from worker.observe import metrics
from worker.store import stream_end
from worker.store.keys import Keys

log = logging.getLogger("worker.api.sse")

Entry = tuple[str, str, str]
"""An event as the stream holds it: its id, its type and its data (JSON text)."""
_END = ("", "", "")
QUEUE_MAX = 10_000
"""Entries a client may fall behind by; past it its stream is closed (it resumes with
``Last-Event-ID``) rather than held in memory."""


def entry_key(entry_id: str) -> tuple[int, int]:
    turn, _, seq = entry_id.partition("-")
    return int(turn), int(seq or 0)


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
    queue: asyncio.Queue[Entry]
    after: str
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
        self._next_check = 0.0

    @property
    def clients(self) -> int:
        return sum(len(run.subscribers) for run in self._runs.values())

    async def subscribe(self, run_id: str, after: str) -> Subscription:
        """A client of ``run_id``'s stream from after ``after`` (``0-0``: the start)."""
        run = self._runs.get(run_id)
        if run is None:
            key = self.keys.events(run_id)
            newest = await self.pool.xrevrange(key, count=1)
            run = self._runs.get(run_id)
            if run is None:  # still untracked after the read: the hub goes on from the end
                end = newest[0][0] if newest else "0-0"
                run = _Run(key, max(end, after, key=entry_key))
                self._runs[run_id] = run
                self._by_key[key] = run_id
                self._wake.set()
        # The hub delivers what comes after its cursor; what lies between the client's id
        # and that cursor the client reads itself (it joins the queue first, so nothing the
        # hub reads meanwhile is lost).
        upto = run.cursor if entry_key(after) < entry_key(run.cursor) else None
        sub = Subscription(run_id, run.key, asyncio.Queue(QUEUE_MAX), after, upto)
        run.subscribers.add(sub)
        metrics.event_stream_opened()
        return sub

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

    async def run(self) -> None:
        """Read, fan out and end streams until cancelled; Redis faults are waited out."""
        while True:
            try:
                await self._pass()
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                log.warning("sse.read_failed", extra={"error": str(exc)})
                await asyncio.sleep(1.0)

    async def _pass(self) -> None:
        if not self._runs:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.check_every_s)
            return
        streams = {run.key: run.cursor for run in self._runs.values()}
        keys = list(streams)
        got = False
        for start in range(0, len(keys), self.batch):
            chunk = {k: streams[k] for k in keys[start : start + self.batch]}
            # One batch blocks until something comes; several are polled in turn.
            block = self.block_ms if len(keys) <= self.batch else None
            reply = await self.reader.xread(chunk, count=500, block=block)
            for key, entries in reply or ():
                got = got or bool(entries)
                self._deliver(key, entries)
        if not got and len(keys) > self.batch:
            await asyncio.sleep(self.block_ms / 1000 / 5)
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + self.check_every_s
            await self._end_finished()
        self._close_ended()

    def _deliver(self, key: str, entries: list[tuple[str, dict[str, str]]]) -> None:
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
                    self._close(run, sub)

    def _close(self, run: _Run, sub: Subscription) -> None:
        if sub in run.subscribers:
            run.subscribers.discard(sub)
            metrics.event_stream_closed()
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(_END)

    async def _end_finished(self) -> None:
        """Where each run's stream ends, once it has (:mod:`worker.store.stream_end`)."""
        items = list(self._runs.items())
        pipe = self.reader.pipeline(transaction=False)
        for run_id, _ in items:
            stream_end.ask(pipe, self.keys, run_id)
        replies = await pipe.execute()
        for at, (_, run) in enumerate(items):
            run.end = stream_end.end_of(replies[2 * at], replies[2 * at + 1])

    def _close_ended(self) -> None:
        """End the client streams of every ended run the hub has read to its end."""
        for run_id, run in list(self._runs.items()):
            if run.end is not None and stream_end.reached(run.cursor, run.end):
                for sub in list(run.subscribers):
                    self._close(run, sub)
                self._runs.pop(run_id, None)
                self._by_key.pop(run.key, None)


async def stream(hub: StreamHub, run_id: str, after: str, keepalive_s: float) -> AsyncIterator[str]:
    """The SSE text of one client: its backlog, then live entries, a comment when idle."""
    sub = await hub.subscribe(run_id, after)
    seen = entry_key(after)
    try:
        yield ": stream open\n\n"
        async for entry in hub.backlog(sub):
            seen = entry_key(entry[0])
            yield format_event(entry)
        while True:
            try:
                entry = await asyncio.wait_for(sub.queue.get(), keepalive_s)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if entry is _END or entry == _END:
                return
            if entry_key(entry[0]) <= seen:
                continue
            seen = entry_key(entry[0])
            yield format_event(entry)
    finally:
        hub.unsubscribe(sub)
