"""A redis-server of our own that may be stopped and restarted (fault injection).

It keeps an append-only file, so a restart keeps its data, as a production Redis with
persistence would. Used by the soak command and the fault tests.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gate:
    """Producers' calls share the gate; a Redis restart takes it alone, so that no producer
    call is cut in half by the restart (what the soak checks is the worker side)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._closed = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._closed = True
            self._cond.wait_for(lambda: self._users == 0)
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class PrivateRedis:
    def __init__(
        self, directory: Path, *, append_only: bool = True, config: Sequence[str] = ()
    ) -> None:
        self.port = free_port()
        self.directory = directory
        self.append_only = append_only
        """Without it (row 10: Redis's own CPU and memory), nothing is written to disk."""
        self.config = tuple(config)
        """More ``--name value`` arguments of redis-server."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.gate = Gate()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.append_only else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
                *self.config,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis did not start")

    def restart(self, down_for_s: float = 1.0) -> None:
        with self.gate.exclusive():
            if self.proc:
                self.proc.terminate()
                self.proc.wait(30)
            time.sleep(down_for_s)
            self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
