"""Output chunks on their way from a Docker exec's reader thread to the turn that reads them
(a local process's pipes are read by the turn itself: sandbox/pipes.py).

The read-ahead is bounded: once ``limit`` bytes wait unread, the reader thread waits, and so
(through the pipe) does the harness's ``write``. A harness printing a gigabyte therefore
costs the worker a few MiB, not a gigabyte. After ``unbound()`` (a kill: nobody reads any
more) readers never wait, so they can drain and exit.
"""

from __future__ import annotations

import queue
import threading
import time

from sandbox.base import Chunk

READ_AHEAD = 4 * 1024 * 1024
_EOF = object()
_NUDGE = object()


class ChunkQueue:
    def __init__(self, streams: int, limit: int = READ_AHEAD) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._open = streams
        self._limit = limit
        self._queued = 0
        self._unbounded = False
        self._room = threading.Condition()

    @property
    def eof(self) -> bool:
        """Every stream closed and every chunk taken."""
        return self._open == 0 and self._queue.empty()

    def put(self, chunk: Chunk) -> None:
        """Queue a chunk once the read-ahead has room for it (called by reader threads)."""
        with self._room:
            while self._queued >= self._limit and not self._unbounded:
                self._room.wait()
            self._queued += len(chunk.data)
        self._queue.put(chunk)

    def close_stream(self) -> None:
        self._queue.put(_EOF)

    def nudge(self) -> None:
        """Wake a reader waiting in :meth:`get` (it returns None at once)."""
        self._queue.put(_NUDGE)

    def unbound(self) -> None:
        with self._room:
            self._unbounded = True
            self._room.notify_all()

    def get(self, timeout: float) -> Chunk | None:
        """The next chunk, or None if none arrived within ``timeout`` seconds (or a
        :meth:`nudge` came first)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if self._open and remaining > 0:
                    item = self._queue.get(timeout=remaining)
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                return None
            if item is _EOF:
                self._open -= 1
                continue
            if item is _NUDGE:
                return None
            assert isinstance(item, Chunk)
            with self._room:
                full = self._queued >= self._limit  # only then may a reader wait for room
                self._queued -= len(item.data)
                if full:
                    self._room.notify_all()
            return item
