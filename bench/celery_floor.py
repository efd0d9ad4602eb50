"""Rows 1 and 4's floor: what Celery itself costs a turn on this broker, with our settings.

``celery -A bench.celery_floor worker`` runs two tasks: ``bench.floor`` XADDs one entry to
the stream it is given (an empty turn); ``bench.floor-harness`` runs a bare harness first (a
subprocess, or an exec in a running container through the SDK, as row 4's baseline does)
and then XADDs (a turn with none of our code: Celery's dispatch plus the harness). The app
takes every transport setting from ``worker.app.create_producer_app`` (broker and its
transport, serializer, late acks, prefetch, pool, concurrency, task events), so the floor
moves when ours does; it loads none
of our tasks or worker hooks.
:func:`round_trip` times ``send_task`` -> that entry seen by ``XREAD BLOCK``, the way row 1
times a turn.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery

from bench.at_once import submit_at_once
from config import Settings, load_settings

if TYPE_CHECKING:
    from bench.context import Bench

TASK = "bench.floor"
HARNESS_TASK = "bench.floor-harness"
QUEUE_SUFFIX = ".bench-floor"
SHARED = (
    "task_serializer",
    "accept_content",
    "task_ignore_result",
    "task_acks_late",
    "task_reject_on_worker_lost",
    "task_acks_on_failure_or_timeout",
    "task_track_started",
    "task_send_sent_event",
    "worker_send_task_events",
    "worker_prefetch_multiplier",
    "worker_pool",
    "worker_concurrency",
    "worker_hijack_root_logger",
    "broker_connection_retry_on_startup",
    "broker_transport",
    "broker_transport_options",
    "timezone",
)
"""The settings of ``worker.app`` that shape a message's way from producer to task body."""


def make_app(settings: Settings) -> Celery:
    from worker.app import create_producer_app

    ours = create_producer_app(settings)
    app = Celery("bench-floor", broker=settings.broker_url)
    app.conf.update({name: ours.conf[name] for name in SHARED})
    queue = settings.key_prefix + QUEUE_SUFFIX
    app.conf.task_default_queue = queue
    client = redis.Redis.from_url(settings.redis_url)

    raw: list[Any] = []
    raw_lock = threading.Lock()

    @app.task(name=TASK)
    def floor(stream: str, token: str) -> None:
        client.xadd(stream, {"token": token, "ts": repr(time.time())})

    @app.task(name=HARNESS_TASK)
    def floor_harness(stream: str, token: str, container: str, argv: list[str], stdin: str) -> None:
        if container:
            with raw_lock:
                if not raw:
                    from bench.docker_raw import RawDocker

                    raw.append(RawDocker())
            out, _ = raw[0].exec(container, argv, stdin.encode())
        else:
            out = subprocess.run(argv, input=stdin.encode(), capture_output=True).stdout
        ok = b'"complete"' in out
        client.xadd(stream, {"token": token, "ts": repr(time.time()), "ok": str(int(ok))})

    return app


def queue_name(prefix: str) -> str:
    return prefix + QUEUE_SUFFIX


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The floor's worker, with the bench worker's environment; ready once it consumes."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.celery_floor", "worker", "-l",
             "warning", "--without-mingle", "--without-gossip", "-n",
             f"floor{os.getpid()}@%h"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
    return proc


def round_trip(app: Celery, r: redis.Redis, stream: str, timeout_s: float = 60.0) -> float:
    """Seconds from ``send_task`` to the task's entry seen by ``XREAD BLOCK``."""
    last = r.xrevrange(stream, count=1)
    cursor: Any = last[0][0] if last else "0-0"
    token = os.urandom(8).hex()
    started = time.perf_counter()
    app.send_task(TASK, args=[stream, token], queue=app.conf.task_default_queue)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, entries in r.xread({stream: cursor}, count=100, block=1000) or ():
            for entry_id, fields in entries:
                cursor = entry_id
                if fields[b"token"].decode() == token:
                    return time.perf_counter() - started
    raise TimeoutError(f"the floor task did not run within {timeout_s:g}s")


def throughput(app: Celery, r: redis.Redis, stream: str, count: int) -> tuple[float, float]:
    """``count`` empty tasks sent back to back by one producer: (sends per second, tasks run
    per second from the first send to the last task's entry)."""
    token = os.urandom(8).hex()
    last = r.xrevrange(stream, count=1)
    cursor: Any = last[0][0] if last else "0-0"
    started = time.perf_counter()
    for _ in range(count):
        app.send_task(TASK, args=[stream, token], queue=app.conf.task_default_queue)
    sent = time.perf_counter() - started
    _entries(r, stream, cursor, token, count, 60 + count / 50)
    return count / sent, count / (time.perf_counter() - started)


def _entries(
    r: redis.Redis, stream: str, cursor: Any, token: str, count: int, timeout_s: float
) -> list[dict[bytes, bytes]]:
    """The ``count`` entries carrying ``token`` after ``cursor``, read as they arrive."""
    found: list[dict[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        for _, entries in r.xread({stream: cursor}, count=1000, block=1000) or ():
            for entry_id, fields in entries:
                cursor = entry_id
                if fields[b"token"].decode() == token:
                    found.append(fields)
    if len(found) < count:
        raise TimeoutError(f"{count - len(found)} of {count} floor tasks did not run")
    return found


def burst(
    app: Celery,
    r: redis.Redis,
    stream: str,
    jobs: list[tuple[str, list[str], str]],
    timeout_s: float = 300.0,
) -> tuple[float, int]:
    """One ``bench.floor-harness`` task per job (container or '', argv, stdin), sent by a
    thread each, released together, as row 4 submits its turns: (seconds from the release
    to the last task's entry seen, how many harnesses completed)."""
    token = os.urandom(8).hex()
    last = r.xrevrange(stream, count=1)
    cursor: Any = last[0][0] if last else "0-0"
    queue = app.conf.task_default_queue
    started, _ = submit_at_once(
        [
            lambda job=job: app.send_task(HARNESS_TASK, args=[stream, token, *job], queue=queue)
            for job in jobs
        ]
    )
    found = _entries(r, stream, cursor, token, len(jobs), timeout_s)
    return time.perf_counter() - started, sum(fields[b"ok"] == b"1" for fields in found)


def wait_ready(app: Celery, r: redis.Redis, stream: str, proc: subprocess.Popen[bytes]) -> None:
    """Block until the floor worker runs a task (it is consuming)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the floor worker exited at start")
        try:
            round_trip(app, r, stream, timeout_s=2)
            return
        except TimeoutError:
            continue
    raise RuntimeError("the floor worker did not start consuming")


app = make_app(load_settings()) if os.environ.get("HARNESS_KEY_PREFIX") else None
"""``celery -A bench.celery_floor``: built only where a deployment's settings are set."""


@dataclass(frozen=True)
class Floor:
    round_trip: Callable[[], float]
    """Seconds from a send to the task's entry seen (:func:`round_trip`)."""
    throughput: Callable[[int], tuple[float, float]]
    """(sends/s, tasks run/s) of that many tasks (:func:`throughput`)."""
    burst: Callable[[list[tuple[str, list[str], str]]], tuple[float, int]]
    """(wall, completed) of bare harnesses through Celery at once (:func:`burst`)."""


@contextlib.contextmanager
def running(bench: Bench) -> Iterator[Floor]:
    """The floor's worker for the duration of the block, and what it measures."""
    env = bench.env
    proc = start({**os.environ, **env.vars, "PYTHONUNBUFFERED": "1"}, env.tmp / "floor.log")
    app = make_app(env.settings())
    r = redis.Redis.from_url(env.vars["HARNESS_REDIS_URL"])
    stream = f"{env.prefix}:bench-floor"
    try:
        wait_ready(app, r, stream, proc)
        yield Floor(
            lambda: round_trip(app, r, stream),
            lambda n: throughput(app, r, stream, n),
            lambda jobs: burst(app, r, stream, jobs),
        )
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        r.delete(stream)
        r.close()
        app.close()
