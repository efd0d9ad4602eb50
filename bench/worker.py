"""A real worker process with its own key prefix, as tests/integration/conftest.py starts one.

:class:`IsolatedEnv` (one deployment: its key prefix, workspaces and scope) and
:func:`demo_executable` serve the tests too.

The worker runs through :mod:`bench._worker`, which is ``celery -A worker.app worker`` with
two additions that only a benchmark needs: its Docker containers carry a scope of their own
(so its startup reaper never touches another deployment's containers on a shared daemon, nor
theirs its), and the worker's ``stream.*`` log records are written as JSON lines with their
fields, so a row can read the stream counters (an oversized line is counted there).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.proc_status import memory_bytes, status_field
from config import Settings, load_settings
from worker.client import HarnessClient
from worker.store.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("HARNESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
DEMO_IMAGE = "harness-worker/demo:1"


def demo_executable() -> str:
    """The demo harness as an absolute path, for the local sandbox (no PATH lookups)."""
    candidate = Path(sys.executable).parent / "harness-demo"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("harness-demo")
    if not found:
        raise RuntimeError("harness-demo is not installed: pip install -e '.[dev]'")
    return found


@dataclass
class IsolatedEnv:
    """One isolated deployment: its own key prefix (so its own queues), workspaces, scope."""

    vars: dict[str, str]
    tmp: Path
    clients: list[HarnessClient] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        return self.vars["HARNESS_KEY_PREFIX"]

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    @property
    def scope(self) -> str:
        return f"bench-{self.prefix}"

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            k.removeprefix("HARNESS_").lower(): v for k, v in self.vars.items()
        }
        values.update(overrides)
        return load_settings(**values)

    def client(self, **overrides: Any) -> HarnessClient:
        client = HarnessClient(self.settings(**overrides))
        self.clients.append(client)
        return client

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.vars["HARNESS_REDIS_URL"], decode_responses=True)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        remove_containers(self.scope)
        delete_keys(self.redis(), self.prefix)
        shutil.rmtree(self.tmp / "workspaces", ignore_errors=True)


def make_env(tmp: Path, redis_url: str = REDIS_URL, **extra: str) -> IsolatedEnv:
    prefix = "b" + uuid.uuid4().hex[:10]
    values = {
        "HARNESS_REDIS_URL": redis_url,
        "HARNESS_BROKER_URL": redis_url,
        "HARNESS_KEY_PREFIX": prefix,
        "HARNESS_SANDBOX": "local",
        "HARNESS_WORKSPACE_ROOT": str(tmp / "workspaces"),
        "HARNESS_ALLOWED_EXECUTABLES": "*",
        "HARNESS_NETWORK": "none",
        "HARNESS_ALLOWED_NETWORKS": "none",
        "HARNESS_ALLOWED_SANDBOXES": "docker,local",
        "HARNESS_CONCURRENCY": "64",
        "HARNESS_STREAM_MAXLEN": "1000000",
    }
    values.update(extra)
    tmp.mkdir(parents=True, exist_ok=True)
    return IsolatedEnv(values, tmp)


def delete_keys(client: redis.Redis, prefix: str) -> int:
    """Every key of a deployment: records, streams, queues and Celery's bindings."""
    patterns = [f"{prefix}:*", f"{prefix}.*", f"_kombu.binding.{prefix}.*"]
    patterns.append(f"_kombu.binding_permanent.{prefix}.*")
    deleted = 0
    for pattern in patterns:
        batch: list[str] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    return deleted


def remove_containers(scope: str) -> int:
    """Remove every container this bench created (by its scope label); 0 without Docker. A
    daemon still busy tearing down a row's thousand containers may not answer in time: that is
    said on stderr, with the command that finishes the job, and the results still print."""
    try:
        import docker
    except ImportError:
        return 0
    try:
        client = docker.from_env(timeout=120)
    except Exception:  # noqa: BLE001 -- no daemon: nothing of ours can be there
        return 0
    removed = 0
    try:
        # sparse: the listing alone, not an inspect of each container (a thousand of them)
        for container in client.containers.list(
            all=True, sparse=True, ignore_removed=True, filters={"label": f"harness.scope={scope}"}
        ):
            try:
                container.remove(force=True)
                removed += 1
            except Exception:  # noqa: BLE001 -- already gone
                pass
    except Exception as exc:  # noqa: BLE001 -- the daemon did not answer: say what is left
        print(
            f"bench: could not remove this run's containers ({exc}); remove them with: "
            f"docker rm -f $(docker ps -aq --filter label=harness.scope={scope})",
            file=sys.stderr,
        )
    finally:
        client.close()
    return removed


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    records: Path
    env: IsolatedEnv

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stream_records(self) -> list[dict[str, Any]]:
        """The worker's ``stream.*`` log records, oldest first, as dicts with their fields."""
        try:
            text = self.records.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def rss_bytes(self) -> int:
        return memory_bytes("VmRSS", self.pid)

    def peak_rss_bytes(self) -> int:
        """VmHWM: the peak resident set since start or since :meth:`reset_peak`."""
        return memory_bytes("VmHWM", self.pid)

    def reset_peak(self) -> bool:
        """Reset VmHWM (Linux >= 4.0, needs to own the process or be root)."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def cpu_seconds(self) -> float:
        """User + system CPU time the worker process has used (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def threads(self) -> int:
        return status_field("Threads", self.pid)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def signal_and_wait(proc: subprocess.Popen[bytes], sig: int, timeout: float = 60.0) -> None:
    """Send ``sig`` to a live process and wait for it; SIGKILL it if it outlives ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def start_worker(env: IsolatedEnv, *, log_level: str = "info", **overrides: str) -> WorkerProcess:
    """Start ``celery -A worker.app worker`` (threads pool) and wait until it consumes."""
    name = f"bench{uuid.uuid4().hex[:6]}"
    variables = {**env.vars, **overrides}
    log = env.tmp / f"{name}.log"
    records = env.tmp / f"{name}.records.jsonl"
    full_env = {
        **os.environ,
        **variables,
        "PYTHONUNBUFFERED": "1",
        "BENCH_DOCKER_SCOPE": env.scope,
        "BENCH_RECORDS": str(records),
        "BENCH_PARENT_PID": str(os.getpid()),
    }
    r = env.redis()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench._worker",
                "-l",
                log_level,
                "-n",
                f"{name}@{socket.gethostname()}",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = WorkerProcess(proc, log, records, env)
    if wait_until_consuming(r, env.keys, proc):
        return worker
    worker.stop()
    raise RuntimeError(f"worker did not become ready:\n{worker.logs()[-4000:]}")


def wait_until_consuming(
    r: redis.Redis, keys: Keys, proc: subprocess.Popen[bytes], timeout_s: float = 60.0
) -> bool:
    """Wait until the worker process ``proc`` beats as a consumer (worker/fleet/hosts.py): its
    queues, host queues included, are then being consumed. Raises if it exits first."""
    worker_key = keys.worker_alive(f"{socket.gethostname()}:{proc.pid}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
            raise RuntimeError(f"worker exited at start ({out}): see its log")
        if r.exists(worker_key):
            return True
        time.sleep(0.05)
    return False


def iter_records(worker: WorkerProcess, message: str) -> Iterator[dict[str, Any]]:
    for record in worker.stream_records():
        if record.get("message") == message:
            yield record
