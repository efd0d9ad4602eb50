"""sandbox/threads.py: jobs run at once, idle threads are reused, then end."""

from __future__ import annotations

import threading
import time

import pytest

from sandbox.threads import ThreadPool


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name in {"sandbox-idle", "job"}}


def test_a_thread_whose_job_ended_runs_the_next_one_under_the_next_name() -> None:
    pool = ThreadPool(idle_s=5.0)
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def job(last: bool) -> None:
        me = threading.current_thread()
        seen.append((me.ident or 0, me.name))
        if last:
            done.set()

    pool.start(lambda: job(False), "first")
    deadline = time.monotonic() + 5
    while pool._idle == 0 and time.monotonic() < deadline:  # the first job's thread waits
        time.sleep(0.01)
    pool.start(lambda: job(True), "second")
    assert done.wait(5)
    (first_id, first_name), (second_id, second_name) = seen
    assert (first_name, second_name) == ("first", "second")
    assert first_id == second_id


def test_jobs_that_block_each_get_a_thread_of_their_own() -> None:
    pool = ThreadPool(idle_s=5.0)
    release = threading.Event()
    started = threading.Semaphore(0)

    def job() -> None:
        started.release()
        release.wait(10)

    for _ in range(20):
        pool.start(job, "job")
    try:
        for _ in range(20):
            assert started.acquire(timeout=5), "a job waited for another to end"
    finally:
        release.set()


def test_a_job_that_raises_leaves_its_thread_serving(caplog: pytest.LogCaptureFixture) -> None:
    pool = ThreadPool(idle_s=5.0)
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    pool.start(boom, "boom")
    deadline = time.monotonic() + 5
    while pool._idle == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool._idle == 1
    pool.start(ran.set, "after")
    assert ran.wait(5)
    assert "sandbox.thread_failed" in caplog.text


def test_idle_threads_end_after_their_wait() -> None:
    pool = ThreadPool(idle_s=0.2)
    before = _pool_threads()
    finished = threading.Event()
    pool.start(finished.set, "job")
    assert finished.wait(5)
    deadline = time.monotonic() + 5
    while (_pool_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_pool_threads() - before)
    assert pool._idle == 0
    again = threading.Event()
    pool.start(again.set, "job")  # a new thread, none being idle
    assert again.wait(5)
