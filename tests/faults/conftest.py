"""Fault injection: private Redis servers we may stop and restart, and leak checks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.private_redis import PrivateRedis
from tests.conftest import require
from tests.integration.conftest import env, workers  # noqa: F401 -- fixtures re-used here


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    (tmp_path / "redis-data").mkdir()
    server = PrivateRedis(tmp_path / "redis-data")
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
