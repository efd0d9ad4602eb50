"""Per-process dependencies of a worker: Redis, the run store, sandboxes, shutdown state."""

from __future__ import annotations

import os
import socket
import threading
from functools import lru_cache
from pathlib import Path

from celery import Celery

from config import Settings, get_settings
from sandbox.base import Sandbox, SandboxError
from worker.app import turn_sender
from worker.deps import Shutdown, TurnDeps
from worker.fleet.lifecycle import end_run
from worker.options.policy import bridge_config, egress_config
from worker.store.keys import Keys
from worker.store.records import RunStore
from worker.store.redis_client import redis_client

_lock = threading.Lock()
_sandboxes: dict[str, Sandbox] = {}


def make_sandbox(backend: str, settings: Settings) -> Sandbox:
    root = Path(settings.workspace_root)
    if backend == "local":
        from sandbox.local import LocalSandbox

        return LocalSandbox(root / "local")
    if backend == "docker":
        # The one place the worker names the Docker backend (tests/unit/test_layout.py).
        from sandbox.docker.sandbox import DockerSandbox

        docker_sandbox: Sandbox = DockerSandbox(
            root / "docker",
            base_url=settings.docker_url,
            scope=settings.key_prefix,
            warm_pool=settings.warm_pool,
            egress=egress_config(settings),
            bridge=bridge_config(settings),
        )
        return docker_sandbox
    raise SandboxError(f"unknown sandbox backend {backend!r}")


def sandbox_for(backend: str) -> Sandbox:
    with _lock:
        if backend not in _sandboxes:
            _sandboxes[backend] = make_sandbox(backend, get_settings())
        return _sandboxes[backend]


@lru_cache(maxsize=1)
def deps() -> TurnDeps:
    settings = get_settings()
    client = redis_client(settings)
    keys = Keys(settings.key_prefix)
    return TurnDeps(
        settings=settings,
        redis=client,
        keys=keys,
        store=RunStore(client, keys, settings.retention_s),
        sandbox_for=sandbox_for,
        worker_id=f"{socket.gethostname()}:{os.getpid()}",
        shutdown=Shutdown(settings.shutdown_grace_s),
        send_turn=turn_sender(worker_app()),
        end_run=end_run,
    )


def worker_app() -> Celery:
    """The worker's Celery app (``celery -A worker.app``)."""
    from worker import app

    return app.app
