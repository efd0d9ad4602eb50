"""Real Redis, real worker processes, real sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.worker import IsolatedEnv as Env
from bench.worker import wait_until_consuming
from tests.conftest import ROOT, demo_executable


def make_env(tmp: Path, redis_url: str, **extra: str) -> Env:
    prefix = "t" + uuid.uuid4().hex[:10]
    values = {
        "HARNESS_REDIS_URL": redis_url,
        "HARNESS_BROKER_URL": redis_url,
        "HARNESS_KEY_PREFIX": prefix,
        "HARNESS_SANDBOX": "local",
        "HARNESS_WORKSPACE_ROOT": str(tmp / "workspaces"),
        "HARNESS_ALLOWED_EXECUTABLES": "*",
        "HARNESS_ALLOWED_NETWORKS": "none,bridge,host",
        "HARNESS_CONCURRENCY": "8",
        "HARNESS_METRICS_PORT": "0",  # many test workers on one machine; metrics tests pick a port
    }
    values.update(extra)
    return Env(values, tmp)


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    env: Env
    name: str

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def start_worker(
    env: Env,
    *,
    extra_args: tuple[str, ...] = (),
    app: str = "worker.app",
    loglevel: str = "info",
    extra_env: dict[str, str] | None = None,
    **overrides: str,
) -> WorkerProcess:
    """A real worker process (``celery -A app worker``) for ``env``; ready when it returns.

    ``overrides`` are HARNESS_* settings for this worker only; ``extra_env`` other variables.
    """
    name = f"w{uuid.uuid4().hex[:6]}"
    variables = {**env.vars, **overrides}
    full_env = {**os.environ, **variables, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    log = env.tmp / f"{name}.log"
    r = env.redis()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                "-l",
                loglevel,
                "-n",
                f"{name}@%h",
                "--without-mingle",
                "--without-gossip",
                *extra_args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = WorkerProcess(proc, log, env, name)
    try:
        if wait_until_consuming(r, env.keys, proc):
            return worker
    except RuntimeError as exc:
        raise RuntimeError(f"worker exited at start:\n{worker.logs()}") from exc
    worker.stop()
    raise RuntimeError(f"worker did not become ready:\n{worker.logs()}")


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path, redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def shared_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("shared"), redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def shared_worker(shared_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(shared_env)
    yield worker
    worker.stop()


@pytest.fixture
def workers(env: Env) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


DEMO = demo_executable()
