"""Row 12: the HTTP API's event streams. One ``harness api`` process (uvicorn, as the
Procfile runs it) on the bench's Redis; events are written straight to the run streams, as a
worker's publisher writes them, so no turn's cost is in the figures.

- Latency: XADD -> the event's SSE frame read by a client of the API, against a raw
  ``XREAD BLOCK`` client of the same stream in the same run, both reading every entry.
- Fan-out: N SSE clients over M runs on the one API process: open streams per Redis
  connection of the API (a raw client holds one connection per blocked ``XREAD``), the API's
  memory per open stream, and deliveries per second to all of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import httpx
import redis.asyncio as aioredis

from bench.context import Bench
from bench.proc_status import memory_bytes
from bench.stats import p50, percentile
from bench.table import Figure, RowResult
from bench.worker import ROOT
from worker.api import tenants
from worker.options.spec import RunOptions, new_run_id

TARGET_P99_MS = 20.0
"""As row 3's: an event reaches a consumer within 20 ms, the API's stream one more hop."""
TENANT = "bench"


@dataclass(frozen=True)
class ApiSizes:
    latency_events: int
    clients: int
    runs: int
    fan_events: int


SIZES = {
    "full": ApiSizes(latency_events=500, clients=1000, runs=20, fan_events=40),
    "quick": ApiSizes(latency_events=300, clients=300, runs=10, fan_events=20),
    "smoke": ApiSizes(latency_events=30, clients=20, runs=4, fan_events=5),
}


class ApiServer:
    """``uvicorn worker.api.app:create_app`` with the bench deployment's settings and one
    tenant; ready (healthz answers) once entered."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.tenants_file = bench.tmp / "bench-tenants.json"
        _, self.key = tenants.add_tenant(self.tenants_file, TENANT)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ApiServer:
        env = {
            **os.environ,
            **self.bench.env.vars,
            "HARNESS_TENANTS_FILE": str(self.tenants_file),
            "HARNESS_API_RATE_LIMIT": "0",
            # The fan-out holds up to 1,000 streams of one tenant (the default allows 50).
            "HARNESS_API_STREAMS_PER_TENANT": "0",
        }
        argv = [sys.executable, "-m", "uvicorn", "--factory", "worker.api.app:create_app"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("harness api exited at start")
            try:
                if httpx.get(f"{self.url}/v1/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError("harness api did not become ready")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def http(self, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.key}"},
            limits=httpx.Limits(max_connections=connections + 10),
            timeout=httpx.Timeout(120, connect=60, pool=60),
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_connections(pid: int, redis_url: str) -> int:
    """``pid``'s established TCP connections to the Redis of ``redis_url`` (from /proc)."""
    port = f":{urlsplit(redis_url).port or 6379:04X}"
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "01" and parts[2].endswith(port) and parts[9] in inodes:
                count += 1
    return count


def make_runs(bench: Bench, n: int) -> list[str]:
    """Runs of the tenant with no turn in flight (their streams are written by the row)."""
    store = bench.client.store
    made = []
    for _ in range(n):
        run_id = new_run_id()
        options = RunOptions(harness="stdio-json", executable="harness-demo")
        store.create(run_id, options, queue="bench", sandbox="local", tenant=TENANT)
        made.append(run_id)
    return made


async def read_sse(
    http: httpx.AsyncClient, run_id: str, want: int, seen: dict[str, float], ready: asyncio.Event
) -> list[str]:
    """The entry ids of ``want`` events of the run's stream, in the order they came, each
    one's arrival time in ``seen``; ``ready`` is set once the stream is open."""
    ids: list[str] = []
    async with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
        if response.status_code != 200:
            ready.set()
            return ids
        buffer = ""
        async for chunk in response.aiter_text():
            if ": stream open" in chunk:
                ready.set()
            buffer += chunk
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                for line in block.split("\n"):
                    if line.startswith("id: "):
                        seen.setdefault(line[4:], time.perf_counter())
                        ids.append(line[4:])
            if len(ids) >= want:
                break
    return ids


def _entry(seq: int) -> dict[str, str | float]:
    data = json.dumps({"text": f"line {seq}"})
    return {"type": "assistant-text", "data": data, "ts": time.time()}


async def _raw_reader(url: str, key: str, want: int, seen: dict[str, float]) -> list[str]:
    reader = aioredis.Redis.from_url(url, decode_responses=True)
    ids: list[str] = []
    cursor = "0-0"
    try:
        while len(ids) < want:
            for _, entries in await reader.xread({key: cursor}, block=1000) or ():
                for entry_id, _fields in entries:
                    seen.setdefault(entry_id, time.perf_counter())
                    ids.append(entry_id)
                    cursor = entry_id
    finally:
        await reader.aclose()
    return ids


async def latency(bench: Bench, api: ApiServer, n: int) -> tuple[list[float], list[float], bool]:
    """(SSE latencies, raw XREAD latencies) in ms, and whether both saw every event in order."""
    (run_id,) = make_runs(bench, 1)
    key = bench.stream(run_id)
    url = bench.env.vars["HARNESS_REDIS_URL"]
    writer = aioredis.Redis.from_url(url, decode_responses=True)
    sent: dict[str, float] = {}
    by_sse: dict[str, float] = {}
    by_raw: dict[str, float] = {}
    ready = asyncio.Event()
    async with api.http(2) as http:
        sse = asyncio.create_task(read_sse(http, run_id, n, by_sse, ready))
        raw = asyncio.create_task(_raw_reader(url, key, n, by_raw))
        await asyncio.wait_for(ready.wait(), 30)
        await asyncio.sleep(0.5)  # the API's reader has the run among its streams
        for seq in range(n):
            entry_id = f"1-{seq + 1}"
            sent[entry_id] = time.perf_counter()
            await writer.xadd(key, _entry(seq), id=entry_id)
            await asyncio.sleep(0.005)
        sse_ids = await asyncio.wait_for(sse, 60)
        raw_ids = await asyncio.wait_for(raw, 60)
    await writer.aclose()
    order = list(sent)
    ok = sse_ids == order and raw_ids == order
    if not ok:
        return [], [], False
    return (
        [(by_sse[i] - sent[i]) * 1000 for i in order],
        [(by_raw[i] - sent[i]) * 1000 for i in order],
        True,
    )


@dataclass
class FanOut:
    per_stream_kib: float
    streams_per_connection: float
    connections: int
    deliveries_per_s: float
    complete: bool


async def fan_out(bench: Bench, api: ApiServer, sizes: ApiSizes) -> FanOut:
    runs = make_runs(bench, sizes.runs)
    url = bench.env.vars["HARNESS_REDIS_URL"]
    writer = aioredis.Redis.from_url(url, decode_responses=True)
    before = memory_bytes("VmRSS", api.pid)
    async with api.http(sizes.clients) as http:
        readies = [asyncio.Event() for _ in range(sizes.clients)]
        seen: list[dict[str, float]] = [{} for _ in readies]
        tasks = [
            asyncio.create_task(
                read_sse(http, runs[i % sizes.runs], sizes.fan_events, seen[i], readies[i])
            )
            for i in range(sizes.clients)
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
        await asyncio.sleep(1.0)
        opened = memory_bytes("VmRSS", api.pid)
        connections = redis_connections(api.pid, url)
        began = time.perf_counter()
        for seq in range(sizes.fan_events):
            pipe = writer.pipeline(transaction=False)
            for run_id in runs:
                pipe.xadd(bench.stream(run_id), _entry(seq), id=f"1-{seq + 1}")
            await pipe.execute()
        got = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        took = time.perf_counter() - began
    await writer.aclose()
    deliveries = sum(len(ids) for ids in got)
    return FanOut(
        per_stream_kib=(opened - before) / 1024 / sizes.clients,
        streams_per_connection=sizes.clients / max(connections, 1),
        connections=connections,
        deliveries_per_s=deliveries / took if took > 0 else float("nan"),
        complete=all(len(ids) == sizes.fan_events for ids in got),
    )


def run(bench: Bench) -> RowResult:
    sizes = SIZES[bench.profile]
    result = RowResult(
        "12",
        f"API event streams ({sizes.latency_events} events; {sizes.clients} SSE clients "
        f"over {sizes.runs} runs)",
    )
    with ApiServer(bench) as api:
        sse_ms, raw_ms, in_order = asyncio.run(latency(bench, api, sizes.latency_events))
        fan = asyncio.run(fan_out(bench, api, sizes))
    result.checks[f"latency: all {sizes.latency_events} events to both clients, in order"] = (
        in_order
    )
    result.checks[f"fan-out: every one of {sizes.clients} clients got all its events"] = (
        fan.complete
    )
    if in_order:
        p99 = percentile(sse_ms, 99)
        result.add(
            Figure("XADD -> SSE client p50 vs raw XREAD client", p50(sse_ms), p50(raw_ms), "ms"),
            Figure(
                "XADD -> SSE client p99",
                p99,
                percentile(raw_ms, 99),
                "ms",
                target=f"p99 <= {TARGET_P99_MS:g} ms",
                met=p99 <= TARGET_P99_MS,
            ),
        )
    result.add(
        Figure(
            f"open SSE streams per Redis connection of the API ({fan.connections} held) vs "
            "a raw XREAD client",
            fan.streams_per_connection,
            1.0,
            "streams",
        ),
        Figure("  API memory per open SSE stream", fan.per_stream_kib, None, "KiB"),
        Figure(
            f"  deliveries/s fanned out to {sizes.clients} SSE clients",
            fan.deliveries_per_s,
            None,
            "ev/s",
        ),
    )
    result.notes.append("the SSE clients run in the bench process, on the same cores as the API")
    return result
