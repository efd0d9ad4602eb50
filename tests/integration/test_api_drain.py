"""``harness api`` under SIGTERM with an event stream open on a live run: it tells the client
to reconnect (a ``retry:`` and a comment), closes the stream and exits within
HARNESS_API_DRAIN_S; the client resumes on another API process after its last id, nothing
lost or repeated. And Redis out of reach under open streams: each ends with a comment saying
why (and a ``retry:``), not a hang or a broken chunk. A real process, Redis and worker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench.private_redis import PrivateRedis
from tests.integration.api_server import (  # noqa: F401
    ApiProcess,
    api_env,
    api_worker,
    free_port,
    start_api,
)
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.integration.test_api import start
from tests.integration.test_api_sse import is_terminal, parse
from worker.api import tenants

# Mostly waiting on real time (faults, drains, handlers asleep): in the parallel phase.
pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.long]

DRAIN_S = 3.0
LONG_TURN = "@text begun\n@stream 200 0.1\n@complete drained"
"""About 20 s of events: the run outlives the drain by far."""


def start_harness_api(env: Env, tenants_file: Path, **overrides: str) -> ApiProcess:
    """``harness api`` itself (not uvicorn's own command): its process group, ready."""
    return start_api(
        env, "harness-api", procfile=True, HARNESS_TENANTS_FILE=str(tenants_file), **overrides
    )


class Stream:
    """An open SSE response read message by message, in several goes."""

    def __init__(self, response: httpx.Response) -> None:
        self.chunks = response.iter_text()
        self.buffer = ""
        self.closed = False

    def messages(self) -> Iterator[dict]:
        for chunk in self.chunks:
            self.buffer += chunk
            *done, self.buffer = self.buffer.split("\n\n")
            for block in done:
                yield from parse(block + "\n\n")
        self.closed = True

    def until(self, stop: Callable[[dict], bool], within_s: float) -> list[dict]:
        """Messages up to the first ``stop(message)``, its end, or ``within_s`` passing."""
        seen: list[dict] = []
        deadline = time.monotonic() + within_s
        for message in self.messages():
            seen.append(message)
            if stop(message) or time.monotonic() > deadline:
                break
        return seen


@pytest.fixture
def two_apis(api_env: Env, api_worker: WorkerProcess) -> Iterator[tuple[ApiProcess, ApiProcess]]:  # noqa: F811
    tenants_file = api_env.tmp / "drain-tenants.json"
    _, key = tenants.add_tenant(tenants_file, "acme")
    first = start_harness_api(api_env, tenants_file, HARNESS_API_DRAIN_S=str(DRAIN_S))
    second = start_harness_api(api_env, tenants_file)
    first.keys["acme"] = second.keys["acme"] = key
    yield first, second
    first.stop()
    second.stop()


def test_sigterm_drains_open_streams_and_a_client_resumes_elsewhere_exactly(
    two_apis: tuple[ApiProcess, ApiProcess],
) -> None:
    first, second = two_apis
    with first.client("acme") as http:
        run_id = start(http, LONG_TURN)
        with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            stream = Stream(response)
            # Some live events, then SIGTERM with the stream open.
            before = stream.until(lambda m: m.get("id", "").endswith("-8"), 30)
            signalled = time.monotonic()
            os.killpg(first.proc.pid, signal.SIGTERM)
            rest = stream.until(lambda m: False, DRAIN_S + 10)
        assert stream.closed, "the stream stayed open under SIGTERM"
    try:
        code = first.proc.wait(DRAIN_S + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"harness api did not exit within the drain:\n{first.logs()}")
    took = time.monotonic() - signalled
    assert took < DRAIN_S + 3, f"it took {took:.1f}s to exit"
    assert code == 0, first.logs()

    messages = before + rest
    last = messages[-1]
    assert "retry" in last and int(last["retry"]) > 0, messages[-3:]
    assert "reconnect" in last.get("comment", ""), last
    received = [m["id"] for m in messages if "id" in m]
    assert received and not any(map(is_terminal, messages)), "the run ended before the drain"

    with second.client("acme") as http:
        with http.stream(
            "GET",
            f"/v1/runs/{run_id}/events/stream",
            headers={"Last-Event-ID": received[-1]},
        ) as response:
            assert response.status_code == 200
            resumed = [m["id"] for m in Stream(response).until(is_terminal, 60) if "id" in m]
        stored = [e["id"] for e in http.get(f"/v1/runs/{run_id}/events").json()]
    assert received + resumed == stored  # nothing lost, nothing twice, in order
    assert len(set(received + resumed)) == len(stored)


def test_redis_out_of_reach_ends_open_streams_with_a_reason(
    tmp_path: Path,
) -> None:
    redis_server = PrivateRedis(tmp_path)
    redis_server.start()
    env = make_env(tmp_path, redis_server.url, HARNESS_API_KEEPALIVE_S="0.5")
    worker = start_worker(env)
    served: ApiProcess | None = None
    try:
        served = start_api(env, name="unreachable")
        served.add_tenant("acme")
        with served.client("acme") as http:
            run_id = start(http, LONG_TURN)
            with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
                assert response.status_code == 200
                stream = Stream(response)
                stream.until(lambda m: m.get("event") == "assistant-text", 30)
                redis_server.stop()
                stopped = time.monotonic()
                rest = stream.until(lambda m: False, 20)
        assert stream.closed, "the stream hung with Redis gone"
        assert time.monotonic() - stopped < 15
        last = rest[-1]
        assert "Redis cannot be reached" in last.get("comment", ""), rest[-3:]
        assert int(last["retry"]) > 0
        assert "Traceback" not in served.logs()
    finally:
        if served is not None:
            served.stop()
        worker.stop(timeout=5)  # its Redis is gone: no clean stop to wait for
        redis_server.stop()
        for client in env.clients:  # a private server, gone: nothing of it to clean
            client.close()
