"""Fault injection: private Redis servers we may stop and restart, and leak checks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import require
from tests.integration.conftest import Env, WorkerProcess, env, workers  # noqa: F401 -- fixtures' types  # noqa: F401 -- re-used fixtures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateRedis:
    """A redis-server of our own, with an append-only file so a restart keeps its data."""

    port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

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
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis flushes the AOF and exits
            self.proc.wait(10)

    def restart(self, down_for_s: float) -> None:
        self.stop()
        time.sleep(down_for_s)
        self.start()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    server = PrivateRedis(free_port(), tmp_path / "redis-data")
    server.directory.mkdir()
    server.start()
    yield server
    server.stop()


def processes_in(root: Path) -> list[int]:
    """Pids of live processes whose working directory is under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(str(root)):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
