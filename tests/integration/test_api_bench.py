"""Figures of the API's event streams (printed, for docs/performance.md; only correctness is
asserted, never a timing): delivery latency from XADD to an SSE client against a raw XREAD
client in the same run, and a thousand SSE clients on one API process (memory per client,
deliveries per second, Redis connections). Events are written straight to the run streams,
as a worker's publisher does, so no turn's cost is in the figures."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import Env
from tests.integration.test_api_sse import _redis_connections, parse
from worker.options.spec import RunOptions, new_run_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _runs(env: Env, n: int) -> list[str]:
    store = env.client().store
    made = []
    for _ in range(n):
        run_id = new_run_id()
        options = RunOptions(harness="stdio-json", executable="harness-demo")
        store.create(run_id, options, queue="q", sandbox="local", tenant="acme")
        made.append(run_id)
    return made


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _sse(
    http: httpx.AsyncClient, run_id: str, want: int, seen: dict[str, float], ready: asyncio.Event
) -> int:
    got = 0
    async with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
        assert response.status_code == 200
        buffer = ""
        async for chunk in response.aiter_text():
            if not ready.is_set() and ": stream open" in chunk:
                ready.set()
            buffer += chunk
            *done, buffer = buffer.split("\n\n")
            for block in done:
                for message in parse(block + "\n\n"):
                    if "id" in message:
                        seen.setdefault(message["id"], time.perf_counter())
                        got += 1
            if got >= want:
                return got
    return got


@pytest.fixture
def bench_api(env: Env) -> Iterator[ApiProcess]:
    server = start_api(env, "bench")
    server.add_tenant("acme")
    yield server
    server.stop()


def test_sse_latency_against_a_raw_xread_client(env: Env, bench_api: ApiProcess) -> None:
    (run_id,) = _runs(env, 1)
    n = 300
    key = env.keys.events(run_id)

    async def scenario() -> tuple[list[float], list[float]]:
        redis = aioredis.Redis.from_url(env.vars["HARNESS_REDIS_URL"], decode_responses=True)
        reader = aioredis.Redis.from_url(env.vars["HARNESS_REDIS_URL"], decode_responses=True)
        sent: dict[str, float] = {}
        by_sse: dict[str, float] = {}
        by_raw: dict[str, float] = {}

        async def raw() -> None:
            cursor = "0-0"
            while len(by_raw) < n:
                for _, entries in await reader.xread({key: cursor}, block=1000) or ():
                    for entry_id, _fields in entries:
                        by_raw.setdefault(entry_id, time.perf_counter())
                        cursor = entry_id

        ready = asyncio.Event()
        headers = {"Authorization": f"Bearer {bench_api.keys['acme']}"}
        async with httpx.AsyncClient(base_url=bench_api.url, headers=headers, timeout=60) as http:
            sse = asyncio.create_task(_sse(http, run_id, n, by_sse, ready))
            raw_task = asyncio.create_task(raw())
            await asyncio.wait_for(ready.wait(), 30)
            await asyncio.sleep(0.5)  # the hub has the run among its streams
            for seq in range(n):
                entry_id = f"1-{seq}"
                data = json.dumps({"text": f"line {seq}"})
                sent[entry_id] = time.perf_counter()
                await redis.xadd(
                    key, {"type": "assistant-text", "data": data, "ts": time.time()}, id=entry_id
                )
                await asyncio.sleep(0.01)
            assert await asyncio.wait_for(sse, 60) == n
            await asyncio.wait_for(raw_task, 60)
        await redis.aclose()
        await reader.aclose()
        assert set(by_sse) == set(sent) == set(by_raw)
        return (
            [(by_sse[i] - sent[i]) * 1000 for i in sent],
            [(by_raw[i] - sent[i]) * 1000 for i in sent],
        )

    sse_ms, raw_ms = asyncio.run(scenario())
    print(
        f"\nSSE delivery latency, {n} events: API p50 {statistics.median(sse_ms):.2f} ms, "
        f"p99 {_percentile(sse_ms, 0.99):.2f} ms; raw XREAD p50 {statistics.median(raw_ms):.2f} "
        f"ms, p99 {_percentile(raw_ms, 0.99):.2f} ms"
    )


def test_a_thousand_sse_clients_on_one_api_process(env: Env, bench_api: ApiProcess) -> None:
    runs_n, per_run, events = 20, 50, 40
    runs = _runs(env, runs_n)
    pid = bench_api.proc.pid

    async def scenario() -> dict[str, float]:
        redis = aioredis.Redis.from_url(env.vars["HARNESS_REDIS_URL"], decode_responses=True)
        headers = {"Authorization": f"Bearer {bench_api.keys['acme']}"}
        limits = httpx.Limits(max_connections=runs_n * per_run + 10)
        timeout = httpx.Timeout(120, connect=60, pool=60)
        figures: dict[str, float] = {"rss_before_kib": _rss_kib(pid)}
        async with httpx.AsyncClient(
            base_url=bench_api.url, headers=headers, limits=limits, timeout=timeout
        ) as http:
            readies = [asyncio.Event() for _ in range(runs_n * per_run)]
            seen: list[dict[str, float]] = [{} for _ in readies]
            tasks = [
                asyncio.create_task(_sse(http, runs[i // per_run], events, seen[i], readies[i]))
                for i in range(runs_n * per_run)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
            await asyncio.sleep(1.0)
            figures["rss_open_kib"] = _rss_kib(pid)
            figures["redis_connections"] = len(_redis_connections(pid))
            began = time.perf_counter()
            for seq in range(events):
                for run_id in runs:
                    data = json.dumps({"text": f"line {seq}"})
                    await redis.xadd(
                        env.keys.events(run_id),
                        {"type": "assistant-text", "data": data, "ts": time.time()},
                        id=f"1-{seq}",
                    )
            counts = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            figures["fan_out_s"] = time.perf_counter() - began
        await redis.aclose()
        assert counts == [events] * (runs_n * per_run)
        return figures

    f = asyncio.run(scenario())
    clients = runs_n * per_run
    per_client = (f["rss_open_kib"] - f["rss_before_kib"]) / clients
    rate = clients * events / f["fan_out_s"]
    print(
        f"\n{clients} SSE clients over {runs_n} runs on one API process: "
        f"{per_client:.1f} KiB per client (RSS {f['rss_before_kib'] / 1024:.0f} -> "
        f"{f['rss_open_kib'] / 1024:.0f} MiB), {rate:.0f} events/s fanned out "
        f"({clients * events} deliveries in {f['fan_out_s']:.2f} s), "
        f"{f['redis_connections']:.0f} Redis connections"
    )
    assert f["redis_connections"] <= 16
