"""``python -m bench._worker ARGS``: ``celery -A worker.app worker ARGS`` for a benchmark.

Three additions, all outside the code under test: the Docker sandbox gets the scope in
``BENCH_DOCKER_SCOPE`` (the settings have no scope yet, and the default one is shared by
every deployment on the daemon, whose startup reapers would remove each other's
containers); log records named ``stream.*`` are appended to ``BENCH_RECORDS`` as JSON with
their fields; and the worker stops once the process in ``BENCH_PARENT_PID`` is gone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


RECORDED = ("stream.", "workspace.snapshot")
"""The log records a row reads: the stream counters, and each turn's snapshot time (row 1)."""


class RecordFile(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.DEBUG)
        self._path = path
        self._lock_file = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith(RECORDED):
            return
        data: dict[str, Any] = {
            k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
        }
        data["message"] = record.getMessage()
        data["created"] = record.created
        line = json.dumps(data, default=str)
        with self._lock_file, open(self._path, "a") as out:
            out.write(line + "\n")


def _scope_docker(scope: str) -> None:
    from config import Settings
    from sandbox.base import Sandbox
    from worker import runtime

    original = runtime.make_sandbox

    def make_sandbox(backend: str, settings: Settings) -> Sandbox:
        if backend == "docker":
            from sandbox.docker.sandbox import DockerSandbox

            root = Path(settings.workspace_root) / "docker"
            sandbox: Sandbox = DockerSandbox(
                root, base_url=settings.docker_url, scope=scope, warm_pool=settings.warm_pool
            )
            return sandbox
        return original(backend, settings)

    runtime.make_sandbox = make_sandbox


def _die_with_parent(parent: int) -> None:
    """A benchmark killed abruptly (Ctrl-C twice, a closed pipe) must not leave its worker
    behind: stop (warm shutdown) once the process that started this one is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="bench-parent-watch", daemon=True).start()


def main() -> None:
    parent = os.environ.get("BENCH_PARENT_PID")
    if parent:
        _die_with_parent(int(parent))
    scope = os.environ.get("BENCH_DOCKER_SCOPE")
    if scope:
        _scope_docker(scope)
    records = os.environ.get("BENCH_RECORDS")
    if records:
        for name in ("worker", "adapters", "sandbox"):
            logger = logging.getLogger(name)
            logger.addHandler(RecordFile(records))
            if logger.level == logging.NOTSET or logger.level > logging.INFO:
                logger.setLevel(logging.INFO)
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", "-A", "worker.app", "worker", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
