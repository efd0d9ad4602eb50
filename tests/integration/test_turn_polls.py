"""What a turn in flight costs the runs' Redis while its harness is silent, and that a cancel
still stops it: at once through the bell, within the fallback poll when its ring is missed.
A real worker and the demo harness in the local sandbox, on a Redis of this module's own,
watched with MONITOR; and the bell's subscriber through a restart of that Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.private_redis import PrivateRedis
from tests.conftest import require
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient
from worker.store.keys import Keys
from worker.turn.attempt import FALLBACK_POLL_S
from worker.turn.steering import Bell

pytestmark = [pytest.mark.redis, pytest.mark.celery]

IDLE_WINDOW_S = 4.0


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    import shutil

    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    server = PrivateRedis(tmp_path_factory.mktemp("polls-redis"), append_only=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, own_redis: PrivateRedis) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("polls"), own_redis.url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def worker(env: Env) -> Iterator[WorkerProcess]:
    process = start_worker(env)
    yield process
    process.stop()


class Monitor:
    """The commands Redis runs that name ``needle`` (MONITOR), each with when it was seen."""

    def __init__(self, url: str, needle: str) -> None:
        self.url, self.needle = url, needle
        self.seen: list[tuple[float, str]] = []
        self._marker = f"monitor-stop-{uuid.uuid4().hex}"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *_: object) -> None:
        redis.Redis.from_url(self.url).echo(self._marker)
        self._thread.join(10)

    def _watch(self) -> None:
        with redis.Redis.from_url(self.url, decode_responses=True).monitor() as monitor:
            self._ready.set()
            while True:
                command = str(monitor.next_command()["command"])
                if self._marker in command:
                    return
                if self.needle in command:
                    self.seen.append((time.monotonic(), command))

    def first_after(self, at: float, start: str, timeout: float) -> float | None:
        """When the first command starting with ``start`` was seen after ``at`` (waits)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [t for t, command in list(self.seen) if t > at and command.startswith(start)]
            if found:
                return found[0]
            time.sleep(0.01)
        return None


def sleeping_turn(client: HarnessClient) -> str:
    """A run whose first turn's harness said something and now sleeps (no output)."""
    run_id = client.start_run("stdio-json", "@text sleeping\n@sleep 60", executable=DEMO)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(e.type == "assistant-text" for e in client.events(run_id)):
            return run_id
        time.sleep(0.05)
    raise AssertionError(f"the turn of {run_id} never said anything")


def test_an_idle_turn_in_flight_costs_redis_almost_nothing(
    env: Env, own_redis: PrivateRedis, worker: WorkerProcess
) -> None:
    client = env.client()
    run_id = sleeping_turn(client)
    time.sleep(0.5)
    with Monitor(own_redis.url, run_id) as monitor:
        time.sleep(IDLE_WINDOW_S)
    # Polled every 0.2 s, its cancel mark and its messages were 2 commands each poll: 40 here.
    # Now each is asked every FALLBACK_POLL_S (4-6 in the window), with the owner's heartbeat
    # (a SET every 10 s) and, once every 30 s, a look when the bell's subscriber reconnects.
    commands = [command for _, command in monitor.seen]
    assert len(commands) <= 10, commands
    client.cancel(run_id)
    assert client.wait(run_id, 1, timeout=30).data["reason"] == "cancelled"


def test_a_cancel_rings_and_stops_a_sleeping_turn_at_once(
    env: Env, own_redis: PrivateRedis, worker: WorkerProcess
) -> None:
    client = env.client()
    run_id = sleeping_turn(client)
    with Monitor(own_redis.url, run_id) as monitor:
        # Right after a fallback poll, so that only the ring can make it quick.
        polled = monitor.first_after(time.monotonic(), "EXISTS", FALLBACK_POLL_S + 2)
        assert polled is not None
        began = time.monotonic()
        assert client.cancel(run_id) is True
        terminal = client.wait(run_id, 1, timeout=30)
        took = time.monotonic() - began
        checked = monitor.first_after(began, "EXISTS", 5)
    assert terminal.type == "session-error" and terminal.data["reason"] == "cancelled"
    assert checked is not None and checked - began < 0.5  # not at the next fallback poll
    assert took < FALLBACK_POLL_S / 2, took


def test_a_cancel_whose_ring_is_missed_stops_the_turn_at_the_fallback_poll(
    env: Env, own_redis: PrivateRedis, worker: WorkerProcess
) -> None:
    client = env.client()
    run_id = sleeping_turn(client)
    keys = Keys(env.vars["HARNESS_KEY_PREFIX"])
    began = time.monotonic()
    client.redis.set(keys.cancel(run_id, 1), "1", ex=600)  # as an older sender: no ring
    terminal = client.wait(run_id, 1, timeout=30)
    took = time.monotonic() - began
    assert terminal.type == "session-error" and terminal.data["reason"] == "cancelled"
    assert took < FALLBACK_POLL_S + 1.5, took


def test_the_bell_says_when_it_is_not_listening_and_rings_all_when_it_is_back(
    private_redis: PrivateRedis,
) -> None:
    """While its subscriber is cut (Redis restarted) the loop must poll fast; once it is back
    every turn looks at once, for what was sent meanwhile."""
    client = redis.Redis.from_url(
        private_redis.url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30,
        retry=Retry(NoBackoff(), 1),
    )  # fmt: skip
    keys = Keys("t" + uuid.uuid4().hex[:10])
    bell, rings = Bell(), list[float]()
    bell.register(client, keys, "r-1", 1, lambda: rings.append(time.monotonic()))
    assert until(lambda: bell.listening(client, keys))
    client.publish(keys.messages_channel(), "r-1:1")
    assert until(lambda: len(rings) == 1)
    private_redis.stop()
    try:
        assert until(lambda: not bell.listening(client, keys))
    finally:
        private_redis.start()
    assert until(lambda: bell.listening(client, keys), timeout=15)
    assert until(lambda: len(rings) == 2)  # rung on its return, nothing published
    bell.unregister(keys, "r-1", 1)


def until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
