"""Shared test plumbing: service checks that skip locally and fail under CI=true."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.private_redis import PrivateRedis
from bench.worker import demo_executable  # noqa: F401 -- the suite's demo harness path

CI = os.environ.get("CI") == "true"
ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("HARNESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get("HARNESS_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def require(ok: bool, reason: str) -> None:
    """Skip when a service is missing locally; under CI a missing service is a failure."""
    if not ok:
        if CI:
            pytest.fail(f"required in CI: {reason}")
        pytest.skip(reason)


def _redis_up(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not _redis_up(REDIS_URL) and shutil.which("redis-server"):
        subprocess.run(
            [
                "redis-server",
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=False,
            capture_output=True,
        )
        for _ in range(50):
            if _redis_up(REDIS_URL):
                break
            time.sleep(0.1)
    require(_redis_up(REDIS_URL), f"Redis is not reachable at {REDIS_URL}")
    return REDIS_URL


def _rabbit_up(url: str) -> bool:
    from kombu.connection import Connection

    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:  # noqa: BLE001 -- any failure means "not usable here"
        return False


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    require(_rabbit_up(RABBITMQ_URL), f"RabbitMQ is not reachable at {RABBITMQ_URL}")
    return RABBITMQ_URL


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis server of this test's own, which it may stop and restart."""
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    (tmp_path / "redis-data").mkdir()
    server = PrivateRedis(tmp_path / "redis-data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def shipped_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings as shipped: no HARNESS_ variable and no .env from the shell or the checkout
    (use it with ``pytestmark = pytest.mark.usefixtures("shipped_settings")``)."""
    for name in list(os.environ):
        if name.startswith("HARNESS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


SECOND_DOCKERD = "second-dockerd"
"""Files whose tests start, stop or load ``scripts/second-dockerd``: one such daemon per
machine, so they run one after another whichever way the suite is spread."""
SHARED_GROUPS = {
    "tests/faults/test_chaos.py": SECOND_DOCKERD,
    "tests/integration/test_docker_runs.py": SECOND_DOCKERD,
    "tests/integration/test_host_identity.py": SECOND_DOCKERD,
    "tests/scale/test_scale.py": SECOND_DOCKERD,
    "tests/security/test_run_isolation.py": SECOND_DOCKERD,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (scripts/test's second phase) a file's tests run on one
    xdist worker, in order, sharing the file's fixtures; the files of a shared group
    together on one. First: xdist's own hook turns the marks into the group its scheduler
    reads (a node id's ``@group``) and sees no mark added after it. Without the group a
    file's tests spread over both workers: two egress labs bound one port, one file's probe
    containers were counted by another's test."""
    for item in items:
        path = Path(str(item.path))
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(name, name)))
