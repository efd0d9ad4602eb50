"""A harness's stdin as the sandboxes feed it: bytes in order from a writer thread.

The first write is the turn input; with ``keep_open`` (``ExecSpec.keep_stdin``) the pipe
stays open for more (answers to permission requests) until :meth:`StdinPipe.close`.
Writes never block the caller: a harness that does not read its stdin cannot stall the
read loop. Once a write fails (the harness exited or closed stdin) the pipe is *broken*:
later writes are refused, so the caller can treat an answer that cannot be delivered as
what it is.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from sandbox.threads import start_thread

_CLOSE = object()


class StdinPipe:
    """``send`` writes all of its bytes or raises ``OSError``; ``shut`` ends the stream (the
    harness reads EOF) and must not raise."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        shut: Callable[[], None],
        first: bytes,
        *,
        keep_open: bool,
        name: str,
    ) -> None:
        self._send = send
        self._shut = shut
        self._queue: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.broken = False
        """A write failed: the harness no longer reads its stdin."""
        self._queue.put(first)
        if not keep_open:
            self._closed = True
            self._queue.put(_CLOSE)
        start_thread(self._pump, name)

    def write(self, data: bytes) -> bool:
        """Queue ``data``; False when the pipe is closed or broken (nothing will be written)."""
        with self._lock:
            if self._closed or self.broken:
                return False
            self._queue.put(data)
            return True

    def close(self) -> None:
        """End the harness's stdin after what is queued. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_CLOSE)

    def _pump(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                break
            assert isinstance(item, bytes)
            if not item or self.broken:
                continue
            try:
                self._send(item)
            except OSError:
                self.broken = True  # the harness exited (or closed stdin) before reading it
        self._shut()
