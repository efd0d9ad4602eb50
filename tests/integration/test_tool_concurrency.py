"""Tool servers answer calls concurrently, up to their ``concurrency``, and keep them durable;
a call a server took but did not answer in time is reported as slow, not as untaken (real
Redis; the calls made as the run's endpoint makes them, :class:`RedisToolSet`)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import Env
from worker.errors import InvalidInput
from worker.store.keys import SyncRedis
from worker.tools import calls
from worker.tools.backend import Reply

# Mostly waiting on real time (faults, drains, handlers asleep): in the parallel phase.
pytestmark = [pytest.mark.redis, pytest.mark.long]

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class Served:
    """``HarnessClient.serve_tools`` on a thread, stopped (and joined) after the test."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, handlers: object, **options: Any) -> None:
        client = self.env.client()
        thread = threading.Thread(
            target=client.serve_tools,
            args=(name, handlers),
            kwargs={"stop": self.stop, **options},
            daemon=True,
        )
        thread.start()
        self.threads.append(thread)
        r = self.env.redis()
        deadline = time.monotonic() + 10
        while not r.exists(self.env.keys.tool_definitions(name)):
            assert time.monotonic() < deadline, "the server never published its tools"
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


@pytest.fixture
def served(env: Env) -> Iterator[Served]:
    made = Served(env)
    yield made
    made.close()


def caller(env: Env, name: str) -> Callable[..., Reply]:
    """A call to set ``name`` as a run's endpoint makes it: (tool, arguments, timeout_s)."""
    backend = calls.RedisToolSet(cast(SyncRedis, env.redis()), env.keys, "r-conc", name)

    def call(tool: str, arguments: dict[str, Any], timeout_s: float = 30.0) -> Reply:
        call_id = f"t1-{uuid.uuid4().hex[:8]}"
        return backend.call(call_id, tool, arguments, time.time() + timeout_s)

    return call


def test_a_slow_call_does_not_hold_back_another(env: Env, served: Served) -> None:
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "slow done"

    def quick() -> str:
        return "quick done"

    served.start("orders", [slow, quick])
    call = caller(env, "orders")
    with ThreadPoolExecutor(2) as pool:
        slow_call = pool.submit(call, "slow", {"seconds": 3})
        time.sleep(0.3)  # the slow call is taken and running
        began = time.monotonic()
        assert call("quick", {}) == Reply(True, "quick done")
        assert time.monotonic() - began < 1.5  # not after the slow one (3 s)
        assert slow_call.result(10) == Reply(True, "slow done")


def test_a_server_runs_at_most_its_concurrency_at_once(env: Env, served: Served) -> None:
    lock = threading.Lock()
    running, most = [0], [0]

    def work(n: int) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.6)
        with lock:
            running[0] -= 1
        return f"done {n}"

    served.start("orders", [work], concurrency=2)
    call = caller(env, "orders")
    began = time.monotonic()
    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(lambda n: call("work", {"n": n}), range(5)))
    took = time.monotonic() - began
    assert replies == [Reply(True, f"done {n}") for n in range(5)]
    assert most[0] == 2
    assert 1.7 < took < 3.0  # three rounds of two (not five one by one: 3 s)
    # Calls past the bound waited in the stream, not in the server's hands.
    assert env.redis().xpending(env.keys.tool_calls("orders"), calls.GROUP)["pending"] == 0


def test_a_call_taken_but_unanswered_in_time_is_reported_as_slow(env: Env, served: Served) -> None:
    def hang(seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    served.start("orders", [hang])
    late = caller(env, "orders")("hang", {"seconds": 1.5}, timeout_s=0.5)
    server = re.escape(f"{socket.gethostname()}-{os.getpid()}-")
    assert not late.ok
    assert re.fullmatch(
        rf"server {server}\w+ of tool set orders took the call at {STAMP} and did not answer "
        r"within 0\.5s",
        late.output,
    ), late.output
    nobody = caller(env, "nobody")("any", {}, timeout_s=0.3)
    assert nobody == Reply(
        False, "no server of tool set nobody answered within 0.3s (none took the call)"
    )


def test_a_concurrency_outside_its_bounds_is_refused(env: Env) -> None:
    def lookup() -> str:
        return "x"

    client = env.client()
    for bad in (0, 257):
        with pytest.raises(InvalidInput, match="concurrency must be 1 to 256"):
            client.serve_tools("orders", [lookup], concurrency=bad)


def serve_process(env: Env, *options: str) -> subprocess.Popen[bytes]:
    """``harness tools serve orders`` in a process of its own (tests/integration/tool_handlers)."""
    r = env.redis()
    r.delete(env.keys.tool_definitions("orders"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "tools", "serve", "orders",
         "tests.integration.tool_handlers:HANDLERS", *options],
        cwd=ROOT, env={**os.environ, **env.vars}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not r.exists(env.keys.tool_definitions("orders")):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the server never published its tools"
        time.sleep(0.05)
    return proc


def test_calls_a_killed_server_was_running_at_once_are_all_taken_by_another(
    env: Env,
) -> None:
    first = serve_process(env, "--concurrency", "4", "--lease", "1")
    second: subprocess.Popen[bytes] | None = None
    marks = [env.tmp / f"slow-{n}" for n in range(3)]
    call = caller(env, "orders")
    try:
        with ThreadPoolExecutor(3) as pool:
            pending = [
                pool.submit(call, "slow", {"mark": str(mark), "seconds": 4}) for mark in marks
            ]
            deadline = time.monotonic() + 3  # all three start together (one at a time: 12 s)
            while not all(mark.exists() for mark in marks):
                assert time.monotonic() < deadline, "the server ran its calls one at a time"
                time.sleep(0.05)
            assert {mark.read_text() for mark in marks} == {str(first.pid)}
            os.killpg(first.pid, signal.SIGKILL)  # dies holding three calls
            first.wait(10)
            second = serve_process(env, "--concurrency", "4", "--lease", "1")
            replies = [future.result(30) for future in pending]
        assert replies == [Reply(True, f"slow done by {second.pid}")] * 3
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
