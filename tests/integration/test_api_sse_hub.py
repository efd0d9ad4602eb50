"""The API's stream hub on its own (a real Redis, no API process): a run it starts watching
is read at once, even while the hub waits in ``XREAD BLOCK`` on other runs, and the hub
leaves nothing of its own in Redis."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.private_redis import PrivateRedis
from worker.api.sse import Ending, Entry, StreamHub, Subscription
from worker.store.event_ids import START
from worker.store.keys import Keys

pytestmark = pytest.mark.redis

BLOCK_MS = 5000
"""Far longer than a new run may wait for its first event."""
AT_ONCE_S = 1.0


@asynccontextmanager
async def running_hub(
    url: str, keys: Keys, check_every_s: float = 60
) -> AsyncIterator[tuple[StreamHub, aioredis.Redis, asyncio.Task[None]]]:
    reader = aioredis.Redis.from_url(url, decode_responses=True, single_connection_client=True)
    pool = aioredis.Redis.from_url(url, decode_responses=True)
    hub = StreamHub(reader, pool, keys, block_ms=BLOCK_MS, check_every_s=check_every_s)
    task = asyncio.create_task(hub.run())
    try:
        yield hub, pool, task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async for key in pool.scan_iter(f"{keys.prefix}:*"):
            await pool.delete(key)
        await reader.aclose()
        await pool.aclose()


async def running(pool: Any, keys: Keys, *run_ids: str) -> None:
    """Records of runs taking a turn (the hub keeps their streams open)."""
    for run_id in run_ids:
        await pool.hset(keys.run(run_id), "status", "running")
        await pool.expire(keys.run(run_id), 600)


async def first_event(hub: StreamHub, pool: aioredis.Redis, run_id: str) -> float:
    """Seconds from a new run's first entry to its subscriber's queue."""
    sub = await hub.subscribe(run_id, START)
    sent = time.monotonic()
    await pool.xadd(hub.keys.events(run_id), {"type": "turn-started", "data": "{}"}, id="1-1")
    item = await asyncio.wait_for(sub.queue.get(), BLOCK_MS / 1000 * 2)
    assert item == ("1-1", "turn-started", "{}")
    return time.monotonic() - sent


async def parked(hub: StreamHub, pool: aioredis.Redis, run_id: str) -> Subscription:
    """The hub watching ``run_id`` alone, waiting in XREAD BLOCK on it."""
    await running(pool, hub.keys, run_id)
    sub = await hub.subscribe(run_id, START)
    await asyncio.sleep(0.3)
    return sub


def scenario(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_new_run_is_read_at_once_while_the_hub_waits_on_another(redis_url: str) -> None:
    keys = Keys("t" + uuid.uuid4().hex[:10])

    async def body() -> None:
        async with running_hub(redis_url, keys) as (hub, pool, _):
            await parked(hub, pool, "idle")
            await running(pool, keys, "fresh", "later")
            assert await first_event(hub, pool, "fresh") < AT_ONCE_S
            assert await first_event(hub, pool, "later") < AT_ONCE_S

    scenario(body)


def test_a_new_run_is_read_at_once_after_redis_restarts(private_redis: PrivateRedis) -> None:
    keys = Keys("t" + uuid.uuid4().hex[:10])

    async def body() -> None:
        async with running_hub(private_redis.url, keys) as (hub, pool, _):
            idle = await parked(hub, pool, "idle")
            await running(pool, keys, "before")
            assert await first_event(hub, pool, "before") < AT_ONCE_S
            await asyncio.to_thread(private_redis.restart, 0.5)
            ended: Entry | Ending = await asyncio.wait_for(idle.queue.get(), BLOCK_MS / 1000)
            assert isinstance(ended, Ending) and ended.retry_ms is not None
            await asyncio.sleep(1.5)  # the hub is back from its pause after the fault
            await parked(hub, pool, "idle")
            await running(pool, keys, "after")
            assert await first_event(hub, pool, "after") < AT_ONCE_S

    scenario(body)


def test_the_hub_leaves_no_key_without_an_expiry_nor_any_once_stopped(redis_url: str) -> None:
    keys = Keys("t" + uuid.uuid4().hex[:10])

    async def body() -> None:
        async with running_hub(redis_url, keys) as (hub, pool, task):
            await parked(hub, pool, "idle")
            await running(pool, keys, "fresh")
            await first_event(hub, pool, "fresh")
            runs = {keys.run("idle"), keys.run("fresh"), keys.events("fresh")}
            hubs = {k async for k in pool.scan_iter(f"{keys.prefix}:*")} - runs
            assert all([await pool.ttl(k) > 0 for k in hubs]), hubs
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert {k async for k in pool.scan_iter(f"{keys.prefix}:*")} == runs

    scenario(body)


@pytest.mark.parametrize(
    ("broken", "logged"), [("events", "sse.stream_failed"), ("run", "sse.record_failed")]
)
def test_a_key_redis_refuses_is_logged_as_what_failed_whichever_read_meets_it(
    redis_url: str, caplog: pytest.LogCaptureFixture, broken: str, logged: str
) -> None:
    """The run's stream key (or its record) made a string while the hub waits in XREAD BLOCK
    on it: that wait has checked the key's type already, so the hub's check of the runs'
    records (here on every pass) meets the fault first; the log names the key that failed,
    as the next XREAD would."""
    keys = Keys("t" + uuid.uuid4().hex[:10])
    caplog.set_level(logging.WARNING, logger="worker.api.sse")

    async def body() -> None:
        async with running_hub(redis_url, keys, check_every_s=0) as (hub, pool, _):
            await running(pool, keys, "broken", "other")
            await pool.xadd(keys.events("broken"), {"type": "turn-started", "data": "{}"}, id="1-1")
            victim = await parked(hub, pool, "broken")
            other = await parked(hub, pool, "other")
            key = keys.events("broken") if broken == "events" else keys.run("broken")
            await pool.delete(key)
            await pool.set(key, "not a stream")
            for n in (1, 2):
                await pool.xadd(keys.events("other"), {"type": "t", "data": "{}"}, id=f"1-{n}")
                assert await asyncio.wait_for(other.queue.get(), 5) == (f"1-{n}", "t", "{}")
            assert isinstance(await asyncio.wait_for(victim.queue.get(), 5), Ending)
            assert other.queue.empty()

    scenario(body)
    said = [r.getMessage() for r in caplog.records if r.name == "worker.api.sse"]
    assert said == [logged]


def test_a_runs_last_entries_reach_a_client_that_has_not_taken_them_yet(redis_url: str) -> None:
    """The run's terminal and its end land together, and the hub reads the terminal and
    learns of the end in one pass (its check of the runs' records falls due then: here on
    every pass), while the client is busy sending what it took before. The client must
    get the terminal, then the end (the CI failure: the end emptied the queue, so a client
    of an ended run lost its last events and was never told)."""
    keys = Keys("t" + uuid.uuid4().hex[:10])

    async def body() -> None:
        async with running_hub(redis_url, keys, check_every_s=0) as (hub, pool, _):
            sub = await parked(hub, pool, "run")
            pipe = pool.pipeline()  # as end_run.lua writes them: at once
            for n in (1, 2):
                pipe.xadd(keys.events("run"), {"type": "assistant-text", "data": "{}"}, id=f"1-{n}")
            pipe.xadd(keys.events("run"), {"type": "session-error", "data": "{}"}, id="1-3")
            pipe.hset(keys.run("run"), "status", "ended")
            await pipe.execute()
            await asyncio.sleep(0.5)  # the client busy sending what it took before
            got = [await asyncio.wait_for(sub.queue.get(), 5) for _ in range(4)]
            assert [item[0] for item in got[:3]] == ["1-1", "1-2", "1-3"]  # type: ignore[index]
            assert got[3] == Ending()

    scenario(body)


def test_a_client_too_far_behind_is_told_to_come_back(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose queue is full is disconnected with a ``retry:`` and a comment saying
    why (it was closed as quietly as a run's end: a client other than an ``EventSource``
    took it for the run's end)."""
    keys = Keys("t" + uuid.uuid4().hex[:10])
    monkeypatch.setattr("worker.api.sse.QUEUE_MAX", 3)

    async def body() -> None:
        async with running_hub(redis_url, keys) as (hub, pool, _):
            sub = await parked(hub, pool, "run")
            for n in range(1, 6):
                await pool.xadd(keys.events("run"), {"type": "t", "data": "{}"}, id=f"1-{n}")
            ending = await asyncio.wait_for(sub.queue.get(), 5)
            assert isinstance(ending, Ending) and ending.retry_ms is not None
            assert "behind" in ending.comment

    scenario(body)
