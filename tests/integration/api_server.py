"""A real ``harness api`` process (uvicorn) for an isolated env, and tenants to call it with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from worker.api import tenants


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ApiProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    tenants_file: Path
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant name to its key."""

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, tenant: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)

    def add_tenant(self, name: str, **fields: Any) -> str:
        _, key = tenants.add_tenant(self.tenants_file, name, **fields)
        self.keys[name] = key
        return key

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_api(
    env: Env, name: str = "api", *, procfile: bool = False, **overrides: str
) -> ApiProcess:
    """uvicorn serving ``worker.api.app:create_app`` with ``env``'s settings (``procfile``:
    ``harness api``, the Procfile's command, instead); ready (healthz answers) when it
    returns."""
    tenants_file = Path(overrides.pop("HARNESS_TENANTS_FILE", env.tmp / "tenants.json"))
    port = free_port()
    variables = {
        **os.environ,
        **env.vars,
        "HARNESS_TENANTS_FILE": str(tenants_file),
        "HARNESS_API_RATE_LIMIT": "100000",
        "HARNESS_API_STREAMS_PER_TENANT": "1000",  # the fan-out test holds 300 of one tenant
        **overrides,
        "PYTHONUNBUFFERED": "1",
    }
    log = env.tmp / f"{name}-{port}.log"
    with log.open("wb") as out:
        served = ["--host", "127.0.0.1", "--port", str(port)]
        command = (
            ["worker.cli", "api", *served]
            if procfile
            else [
                "uvicorn",
                "--factory",
                "worker.api.app:create_app",
                *served,
                "--log-level",
                "warning",
            ]
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=ROOT,
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = ApiProcess(proc, f"http://127.0.0.1:{port}", log, tenants_file)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited at start:\n{api.logs()}")
        try:
            if httpx.get(f"{api.url}/v1/healthz", timeout=2).status_code == 200:
                return api
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    api.stop()
    raise RuntimeError(f"the API did not become ready:\n{api.logs()}")


@pytest.fixture(scope="module")
def api_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(
        tmp_path_factory.mktemp("api"),
        redis_url,
        HARNESS_PERMISSION_TIMEOUT_S="60",
        HARNESS_API_KEEPALIVE_S="0.5",
    )
    yield e
    e.close()


@pytest.fixture(scope="module")
def api_worker(api_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(api_env)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def api(api_env: Env, api_worker: WorkerProcess) -> Iterator[ApiProcess]:
    server = start_api(api_env)
    server.add_tenant("acme")
    server.add_tenant("other")
    yield server
    server.stop()
