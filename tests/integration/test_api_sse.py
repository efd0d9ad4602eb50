"""Server-Sent Events of the API: the stream's form, resuming after Last-Event-ID, the
keep-alive, its end with the run, and hundreds of clients on one process sharing a reader
(a real uvicorn, Redis and worker)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.api_server import (  # noqa: F401
    ApiProcess,
    api,
    api_env,
    api_worker,
    free_port,
    start_api,
)
from tests.integration.conftest import Env
from tests.integration.test_api import start, wait_terminal

pytestmark = [pytest.mark.redis, pytest.mark.celery]

TERMINAL = ("turn-complete", "session-error")


def parse(text: str) -> Iterator[dict[str, Any]]:
    """SSE messages as dicts (``id``, ``event``, ``data`` joined) and comments
    (``comment``)."""
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        message: dict[str, Any] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                message["comment"] = line[1:].strip()
            else:
                name, _, value = line.partition(": ")
                message[name] = f"{message[name]}\n{value}" if name in message else value
        yield message


def read_until(response: httpx.Response, stop: Any, timeout: float = 60) -> list[dict]:
    """Messages of an open stream until ``stop(message)`` or its end."""
    seen: list[dict] = []
    buffer = ""
    deadline = time.monotonic() + timeout
    for chunk in response.iter_text():
        buffer += chunk
        *done, buffer = buffer.split("\n\n")
        for block in done:
            seen += parse(block + "\n\n")
            if seen and stop(seen[-1]):
                return seen
        assert time.monotonic() < deadline, "the stream did not reach its stop"
    return seen


def is_terminal(message: dict) -> bool:
    return message.get("event") in TERMINAL


def test_the_stream_carries_id_type_and_data_and_ends_with_the_run(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        run_id = start(http, "@sleep 1\n@stream 3 0.05\n@complete streamed")
        with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            messages = read_until(response, is_terminal)
        events = [m for m in messages if "id" in m]
        listed = http.get(f"/v1/runs/{run_id}/events").json()
        assert [e["id"] for e in events] == [e["id"] for e in listed]
        assert [e["event"] for e in events] == [e["type"] for e in listed]
        assert [json.loads(e["data"]) for e in events] == [e["data"] for e in listed]
        assert any(m.get("comment") == "keep-alive" for m in messages)  # 0.5 s here
        # The stream ends by itself once the run has ended.
        with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            http.delete(f"/v1/runs/{run_id}", params={"wait": 30})
            began = time.monotonic()
            rest = read_until(response, lambda m: False, timeout=30)
            assert time.monotonic() - began < 15
        assert [m["id"] for m in rest if "id" in m] == [e["id"] for e in listed]


def test_last_event_id_resumes_exactly_after_it(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = start(http, "@stream 6 0.2\n@complete resumed")
        path = f"/v1/runs/{run_id}/events/stream"
        with http.stream("GET", path) as response:
            first = read_until(response, lambda m: m.get("id", "").endswith("-3"))
        dropped_at = first[-1]["id"]
        with http.stream("GET", path, headers={"Last-Event-ID": dropped_at}) as response:
            second = read_until(response, is_terminal)
        wait_terminal(http, run_id, 1)
        listed = [e["id"] for e in http.get(f"/v1/runs/{run_id}/events").json()]
        ids = [m["id"] for m in first + second if "id" in m]
        assert ids == listed  # no gap, no duplicate
        with http.stream("GET", path, params={"after": listed[-3]}) as response:
            tail = read_until(response, is_terminal)
        assert [m["id"] for m in tail if "id" in m] == listed[-2:]
        bad = http.get(path, headers={"Last-Event-ID": "not-an-id"})
        assert bad.status_code == 400


def _redis_connections(pid: int) -> set[int]:
    """Local ports of ``pid``'s established TCP connections to port 6379 (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            local, remote, state, inode = parts[1], parts[2], parts[3], parts[9]
            if state == "01" and remote.endswith(":18EB") and inode in inodes:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slow
def test_hundreds_of_streams_share_one_reader_and_few_redis_connections(
    api: ApiProcess,  # noqa: F811
    api_env: Env,  # noqa: F811
) -> None:
    runs_n, per_run = 30, 10
    with api.client("acme") as http:
        runs = [start(http, "@sleep 4\n@stream 5 0.05\n@complete fanned") for _ in range(runs_n)]
    key = api.keys["acme"]
    connected = asyncio.Event()
    opened = 0
    counted: dict[str, int] = {}

    async def client(run_id: str, http: httpx.AsyncClient) -> list[str]:
        nonlocal opened
        ids = []
        async with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            opened += 1
            if opened == runs_n * per_run:
                connected.set()
            buffer = ""
            async for chunk in response.aiter_text():
                buffer += chunk
                *done, buffer = buffer.split("\n\n")
                for block in done:
                    for message in parse(block + "\n\n"):
                        if "id" in message:
                            ids.append(message["id"])
                        if is_terminal(message):
                            return ids
        return ids

    async def measure() -> None:
        await asyncio.wait_for(connected.wait(), 60)
        await asyncio.sleep(0.5)
        ports = _redis_connections(api.proc.pid)
        listed = api_env.redis().client_list()
        counted["api"] = sum(1 for c in listed if int(c["addr"].rsplit(":", 1)[1]) in ports)
        counted["all"] = len(listed)

    async def scenario() -> list[list[str]]:
        limits = httpx.Limits(max_connections=runs_n * per_run + 10)
        async with httpx.AsyncClient(
            base_url=api.url,
            headers={"Authorization": f"Bearer {key}"},
            limits=limits,
            timeout=httpx.Timeout(120, connect=60, pool=60),
        ) as http:
            watcher = asyncio.create_task(measure())
            results = await asyncio.gather(
                *(client(run_id, http) for run_id in runs for _ in range(per_run))
            )
            await watcher
            return results

    results = asyncio.run(scenario())
    with api.client("acme") as http:
        for n, run_id in enumerate(runs):
            listed = [e["id"] for e in http.get(f"/v1/runs/{run_id}/events").json()]
            for ids in results[n * per_run : (n + 1) * per_run]:
                assert ids == listed
    print(f"redis connections with {runs_n * per_run} open streams: {counted}")
    # 300 open streams over 30 runs; the API process holds a handful of Redis connections.
    assert 0 < counted["api"] <= 16, counted


def _open_streams(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=5).text
    (line,) = [x for x in text.splitlines() if x.startswith("harness_event_streams_open ")]
    return float(line.split()[1])


def test_the_api_counts_its_open_streams_on_its_metrics_port(
    api_env: Env,  # noqa: F811
    api_worker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    port = free_port()
    served = start_api(
        api_env,
        name="metrics",
        HARNESS_API_METRICS_PORT=str(port),
        HARNESS_METRICS_ADDR="127.0.0.1",
        HARNESS_TENANTS_FILE=str(tmp_path / "tenants.json"),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        served.add_tenant("acme")
        assert _open_streams(url) == 0
        with served.client("acme") as http:
            run_id = start(http, "@sleep 3\n@complete counted")
            with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
                assert response.status_code == 200
                deadline = time.monotonic() + 10
                while _open_streams(url) != 1 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert _open_streams(url) == 1
            deadline = time.monotonic() + 10
            while _open_streams(url) != 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _open_streams(url) == 0
    finally:
        served.stop()
