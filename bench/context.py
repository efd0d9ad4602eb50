"""What every row shares: sizes, the isolated deployment, its worker, Docker access."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from bench.worker import DEMO_IMAGE, IsolatedEnv, WorkerProcess, demo_executable, make_env
from bench.worker import start_worker as _start_worker
from worker.client import HarnessClient

NOOP = "@complete ok"
"""The no-op turn of the demo harness: a session line and a complete line."""


@dataclass(frozen=True)
class Sizes:
    overhead_turns: int
    overhead_warmup: int
    flood_events: int
    flood_repeats: int
    stamp_lines: int
    stamp_interval_s: float
    concurrent_turns: int
    concurrent_sleep_s: float
    first_turn_repeats: int
    concurrent_repeats: int
    bigline_bytes: int
    bigstream_bytes: int
    bigstream_line_bytes: int
    floor_tasks: int = 1000
    """Empty Celery tasks of row 1's throughput line (one broker, one worker process)."""


PROFILES: dict[str, Sizes] = {
    "full": Sizes(
        overhead_turns=50,
        overhead_warmup=5,
        flood_events=200_000,
        flood_repeats=3,
        stamp_lines=500,
        stamp_interval_s=0.005,
        concurrent_turns=64,
        concurrent_sleep_s=2.0,
        first_turn_repeats=15,
        concurrent_repeats=5,
        bigline_bytes=100_000_000,
        bigstream_bytes=1_000_000_000,
        bigstream_line_bytes=1024,
        floor_tasks=2000,
    ),
    "quick": Sizes(
        overhead_turns=20,
        overhead_warmup=3,
        flood_events=50_000,
        flood_repeats=2,
        stamp_lines=200,
        stamp_interval_s=0.005,
        concurrent_turns=64,
        concurrent_sleep_s=2.0,
        first_turn_repeats=2,
        concurrent_repeats=1,
        bigline_bytes=100_000_000,
        bigstream_bytes=100_000_000,
        bigstream_line_bytes=1024,
    ),
    "smoke": Sizes(
        overhead_turns=3,
        overhead_warmup=1,
        flood_events=2_000,
        flood_repeats=1,
        stamp_lines=20,
        stamp_interval_s=0.005,
        concurrent_turns=4,
        concurrent_sleep_s=0.5,
        first_turn_repeats=1,
        concurrent_repeats=1,
        bigline_bytes=10_000_000,
        bigstream_bytes=4_000_000,
        floor_tasks=50,
        bigstream_line_bytes=1024,
    ),
}


def docker_problem(image: str = DEMO_IMAGE) -> str | None:
    """Why the Docker rows cannot run here, or None."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed"
    try:
        client = docker.from_env(timeout=10)
    except Exception as exc:  # noqa: BLE001 -- any failure means no usable daemon
        return f"Docker is unreachable ({exc})"
    try:
        client.ping()
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"image {image} is missing: scripts/build-images --only demo"
    except Exception as exc:  # noqa: BLE001
        return f"Docker is unreachable ({exc})"
    finally:
        client.close()
    return None


class Bench:
    """One benchmark session: one deployment (key prefix, scope) and its main worker."""

    def __init__(
        self,
        profile: str = "full",
        backends: tuple[str, ...] = ("docker", "local"),
        tmp: Path | None = None,
        **overrides: Any,
    ) -> None:
        self.profile = profile
        self.sizes = replace(PROFILES[profile], **overrides)
        self._tmpdir = None
        if tmp is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="harness-bench-")
            tmp = Path(self._tmpdir.name)
        self.tmp = tmp
        self.env: IsolatedEnv = make_env(tmp)
        problem = docker_problem() if "docker" in backends else None
        self.docker_skip = problem
        self.backends = tuple(b for b in backends if b != "docker" or problem is None)
        self._worker: WorkerProcess | None = None
        self._client: HarnessClient | None = None
        self._redis: redis.Redis | None = None

    # -- the deployment ------------------------------------------------------------------

    @property
    def worker(self) -> WorkerProcess:
        if self._worker is None or self._worker.proc.poll() is not None:
            self._worker = _start_worker(self.env)
        return self._worker

    def stop_worker(self) -> None:
        """Stop the main worker (the next use of :attr:`worker` starts a fresh one)."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def use_worker(self, **overrides: str) -> WorkerProcess:
        """Replace the main worker with one started with these settings (a row that needs a
        fresh process or other settings); the next row after :meth:`stop_worker` gets a
        default one again."""
        self.stop_worker()
        self._worker = _start_worker(self.env, **overrides)
        return self._worker

    @property
    def client(self) -> HarnessClient:
        if self._client is None:
            self._client = self.env.client()
        return self._client

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            self._redis = self.env.redis()
        return self._redis

    def stream(self, run_id: str) -> str:
        return self.env.keys.events(run_id)

    def executable(self, backend: str) -> str:
        return "harness-demo" if backend == "docker" else demo_executable()

    def start_run(self, backend: str, text: str, **options: Any) -> str:
        _ = self.worker  # a run needs a worker consuming its queue
        return self.client.start_run(
            "stdio-json",
            text,
            executable=self.executable(backend),
            sandbox=backend,
            network="none",
            **options,
        )

    def end_run(self, run_id: str) -> None:
        # Whatever goes wrong here, close() removes the deployment's containers and keys.
        with contextlib.suppress(Exception):
            self.client.end(run_id, timeout=60)

    def close(self) -> None:
        self.stop_worker()
        self._client = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        self.env.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bare_env(home: Path) -> dict[str, str]:
    """The environment of a bare harness process (what LocalSandbox gives, minus our vars)."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TMPDIR": str(home),
    }


def bare_subprocess(argv: list[str], stdin: bytes, home: Path) -> tuple[float, bytes]:
    """Run the harness as a plain child process: (seconds, stdout)."""
    started = time.perf_counter()
    result = subprocess.run(
        argv, input=stdin, capture_output=True, env=bare_env(home), cwd=home, check=False
    )
    return time.perf_counter() - started, result.stdout
