"""The sandboxes' short-lived threads (a Docker exec's output reader, a harness's stdin
writer), taken from idle ones where there are.

A local turn started three threads and a Docker turn two (a local turn now reads its pipes
itself: sandbox/pipes.py), and ``Thread.start`` waits until
the new thread has run: on a busy worker that cost a local turn 1.35 ms at the median
(docs/performance.md, row 1). A thread whose job has ended waits up to ``IDLE_S`` for the
next one, then ends. Daemon threads, as the ones started per job were, which is why this is
not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at exit, and a pump
blocked on a harness still running would hold the worker's exit up.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

IDLE_S = 60.0

log = logging.getLogger(__name__)

_Job = tuple[Callable[[], object], str]


class ThreadPool:
    def __init__(self, idle_s: float = IDLE_S) -> None:
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        """Threads waiting for a job and not yet promised one."""

    def start(self, target: Callable[[], object], name: str) -> None:
        """Run ``target`` in a thread called ``name`` (while it runs), at once."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put((target, name))
                return
        threading.Thread(target=self._serve, args=((target, name),), name=name, daemon=True).start()

    def _serve(self, job: _Job) -> None:
        me = threading.current_thread()
        while True:
            target, me.name = job
            try:
                target()
            except Exception:  # a job's own failure must not end the thread quietly
                log.exception("sandbox.thread_failed", extra={"job": me.name})
            me.name = "sandbox-idle"
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_s)
                continue
            except queue.Empty:
                pass
            with self._lock:
                if self._idle:  # nobody promised this thread's wait a job: it ends
                    self._idle -= 1
                    return
            job = self._jobs.get()  # a job was promised as the wait ran out: it is queued


_pool = ThreadPool()


def start_thread(target: Callable[[], object], name: str) -> None:
    """Run ``target`` in a daemon thread of the process's pool (see :class:`ThreadPool`)."""
    _pool.start(target, name)
