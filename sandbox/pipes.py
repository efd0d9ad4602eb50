"""A local process's stdout and stderr, read by whoever calls :meth:`Pipes.read`, in its own
thread: no reader thread, no queue between the pipe and the turn.

A reader thread per stream, handing chunks over a queue, cost a flood of output a fifth of
its throughput (docs/performance.md, row 6): each chunk crossed threads, and the reader took
the GIL from the turn's read loop for every one. The pipes themselves bound what waits: once
they are full the harness blocks in its writes, so a harness that writes faster than its
output is published waits for it, and the worker holds only what the turn has taken.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from typing import IO, Literal

from sandbox.base import Chunk

READ_SIZE = 256 * 1024
"""The most one :meth:`Pipes.read` takes from a pipe."""
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


class Pipes:
    """The open output pipes of one process, and a wake-up for :meth:`nudge`."""

    def __init__(self, streams: dict[Literal["stdout", "stderr"], IO[bytes]]) -> None:
        self._files: dict[int, tuple[Literal["stdout", "stderr"], IO[bytes]]] = {}
        self._poll = select.poll()
        for name, file in streams.items():
            fd = file.fileno()
            os.set_blocking(fd, False)
            self._files[fd] = (name, file)
            self._poll.register(fd, select.POLLIN)
        self._wake: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        """Written by nudge() from another thread; closed under :attr:`_wake_lock` once both
        pipes have ended, so that a late nudge never writes to a number reused since."""
        self._wake_lock = threading.Lock()
        self._poll.register(self._wake, select.POLLIN)
        self._ready: list[int] = []
        """Pipes the last poll found readable and not yet read (only this reader reads them,
        so they stay readable)."""
        self._lock = threading.Lock()
        """Held while reading: a read from another thread waits its turn."""

    @property
    def eof(self) -> bool:
        """Both pipes closed by the process and everything in them read."""
        return not self._files

    def nudge(self) -> None:
        """Make a read waiting now (or the next one) return None at once."""
        with self._wake_lock:
            if self._wake is not None:
                os.eventfd_write(self._wake, 1)

    def read(self, timeout: float) -> Chunk | None:
        """Up to :data:`READ_SIZE` bytes of one pipe, or None if neither had any within
        ``timeout`` seconds (or a :meth:`nudge` came first)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._files:
                if not self._ready and not self._wait(deadline):
                    return None
                fd = self._ready.pop()
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""  # a broken pipe ends its stream, as EOF does
                if data:
                    return Chunk(self._files[fd][0], data)
                self._close(fd)
            return None

    def _wait(self, deadline: float) -> bool:
        """Poll until a pipe is readable (True) or the deadline or a nudge came (False)."""
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            found = self._poll.poll(int(remaining * 1000 + 0.999))
            woken = False
            for fd, mask in found:
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(fd)
                    woken = True
                elif mask & _READABLE:
                    self._ready.append(fd)
            if woken:
                return False
            if self._ready:
                return True
            if remaining <= 0:
                return False

    def _close(self, fd: int) -> None:
        _, file = self._files.pop(fd)
        self._poll.unregister(fd)
        with contextlib.suppress(OSError):
            file.close()
        if not self._files:  # nothing left to wake a read for: a finished turn holds no fd
            with self._wake_lock:
                assert self._wake is not None
                os.close(self._wake)
                self._wake = None
