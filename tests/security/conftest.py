"""Plumbing of the adversarial suite: isolated deployments, real workers, and an audit of every
container those workers create.

- ``start_scoped_worker(env, ...)``: a real Celery worker process (``tests.security.scoped_app``:
  the production app, its Docker sandbox scoped to the key prefix so no other deployment's
  reaper touches these containers).
- ``docker_env``: an Env whose worker runs turns in ``harness-worker/demo:1`` with network
  ``none`` and a strict policy; ``audit``: every container created in that Env's scope is
  inspected at creation and checked against :func:`hardening_problems` when the test ends,
  then removed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.integration.docker_fixtures import demo_image, docker_daemon  # noqa: F401 -- fixtures
from worker.client import HarnessClient, StreamEvent


def start_scoped_worker(
    env: Env, *, loglevel: str = "info", extra_env: dict[str, str] | None = None
) -> WorkerProcess:
    """A real worker process for ``env`` (see the module docstring); ready when it returns."""
    return start_worker(
        env, app="tests.security.scoped_app", loglevel=loglevel, extra_env=extra_env
    )


def docker_vars(**extra: str) -> dict[str, str]:
    """A strict operator policy for turns in the demo image."""
    values = {
        "HARNESS_SANDBOX": "docker",
        "HARNESS_NETWORK": "none",
        "HARNESS_ALLOWED_NETWORKS": "none",
        "HARNESS_ALLOWED_EXECUTABLES": "harness-demo",
        "HARNESS_GRANTS": "stdio-json=DEMO_TOKEN",
        "HARNESS_MEMORY": "256m",
        "HARNESS_CPUS": "1",
        "HARNESS_PIDS": "128",
        "HARNESS_MAX_MEMORY": "512m",
        "HARNESS_MAX_CPUS": "2",
        "HARNESS_MAX_PIDS": "256",
        "HARNESS_TURN_TIMEOUT_S": "60",
        "HARNESS_MAX_TURN_TIMEOUT_S": "120",
        "HARNESS_EXIT_GRACE_S": "1",
        "HARNESS_KILL_GRACE_S": "0.5",
        "HARNESS_CONCURRENCY": "4",
    }
    values.update(extra)
    return values


# -- the container audit ---------------------------------------------------------------------


def hardening_problems(info: dict[str, Any], workspace_root: Path) -> list[str]:
    """Everything about one container (``docker inspect``) that breaks the sandbox rules."""
    host = info.get("HostConfig") or {}
    config = info.get("Config") or {}
    problems = []
    if host.get("Privileged"):
        problems.append("privileged")
    if "ALL" not in (host.get("CapDrop") or []):
        problems.append(f"capabilities not all dropped: CapDrop={host.get('CapDrop')}")
    if host.get("CapAdd"):
        problems.append(f"capabilities added: {host.get('CapAdd')}")
    security = host.get("SecurityOpt") or []
    if not any(opt.split("=")[0].split(":")[0] == "no-new-privileges" for opt in security):
        problems.append(f"no-new-privileges missing: SecurityOpt={security}")
    if any("unconfined" in opt for opt in security):
        problems.append(f"a confinement is switched off: {security}")
    if not host.get("ReadonlyRootfs"):
        problems.append("root filesystem is writable")
    uid = str(config.get("User") or "").partition(":")[0]
    if uid in ("", "0", "root"):
        problems.append(f"runs as root (User={config.get('User')!r})")
    if not host.get("Memory"):
        problems.append("no memory limit")
    elif host.get("MemorySwap") != host.get("Memory"):
        problems.append(f"swap beyond the memory limit: {host.get('MemorySwap')}")
    if not host.get("NanoCpus"):
        problems.append("no CPU limit")
    if not host.get("PidsLimit") or host["PidsLimit"] <= 0:
        problems.append(f"no pids limit ({host.get('PidsLimit')})")
    if host.get("OomKillDisable"):
        problems.append("OOM killer disabled")
    # CgroupnsMode is "host" by default on cgroup v1 hosts (Docker 20.10): not checked.
    for mode in ("NetworkMode", "PidMode", "IpcMode", "UTSMode", "UsernsMode"):
        if host.get(mode) == "host":
            problems.append(f"{mode} is host")
    for field in ("Devices", "Binds", "VolumesFrom", "Sysctls", "DeviceRequests"):
        if host.get(field):
            problems.append(f"{field}: {host.get(field)}")
    mounts = info.get("Mounts") or []
    expected = [
        m
        for m in mounts
        if m.get("Type") == "bind"
        and m.get("Destination") == "/workspace"
        and Path(str(m.get("Source"))).is_relative_to(workspace_root)
    ]
    if len(mounts) != 1 or len(expected) != 1:
        problems.append(f"mounts other than the run's workspace: {mounts}")
    if set(host.get("Tmpfs") or {}) - {"/tmp"}:
        problems.append(f"unexpected tmpfs mounts: {host.get('Tmpfs')}")
    if "docker.sock" in json.dumps(info) or "containerd.sock" in json.dumps(info):
        problems.append("a Docker or containerd socket is reachable")
    return problems


class ContainerAudit:
    """Inspects every container created with the label ``harness.scope=<scope>`` as it is
    created (a Docker events subscription), so that short-lived ones are checked too."""

    def __init__(self, scope: str) -> None:
        import docker

        self.scope = scope
        self.client = docker.from_env(timeout=30)
        self.inspected: dict[str, dict[str, Any]] = {}
        self.vanished: list[str] = []
        self._created: list[str] = []
        self._stream = self.client.events(
            decode=True,
            filters={"type": "container", "event": "create", "label": f"harness.scope={scope}"},
        )
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import docker.errors

        try:
            for event in self._stream:
                ident = event.get("id") or event.get("Actor", {}).get("ID")
                if not ident:
                    continue
                self._created.append(ident)
                try:
                    self.inspected[ident] = self.client.api.inspect_container(ident)
                except docker.errors.NotFound:
                    self.vanished.append(ident)
        except Exception:  # noqa: BLE001 -- the stream is closed at the end of the test
            return

    def containers(self) -> list[dict[str, Any]]:
        """Containers of the scope that exist now (inspected again: the current state)."""
        found = self.client.api.containers(
            all=True, filters={"label": f"harness.scope={self.scope}"}
        )
        return [self.client.api.inspect_container(c["Id"]) for c in found]

    def finish(self) -> None:
        """Pick up containers whose create event is still in flight, stop watching."""
        for info in self.containers():
            self.inspected.setdefault(info["Id"], info)
        self._stream.close()
        self._thread.join(5)

    def remove_all(self) -> None:
        for info in self.containers():
            self.client.api.remove_container(info["Id"], force=True)
        self.client.close()


@pytest.fixture
def docker_env(tmp_path: Path, redis_url: str, demo_image: str) -> Iterator[Env]:  # noqa: F811
    env = make_env(tmp_path, redis_url, **docker_vars())
    yield env
    for client in env.clients:
        client.close()


@pytest.fixture
def audit(docker_env: Env) -> Iterator[ContainerAudit]:
    """Every container of ``docker_env`` must be hardened; the test must create at least one."""
    watcher = ContainerAudit(docker_env.prefix)
    try:
        yield watcher
        watcher.finish()
        root = Path(docker_env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker"
        assert watcher.inspected, "the test created no container to audit"
        assert not watcher.vanished, f"containers gone before inspection: {watcher.vanished}"
        for ident, info in watcher.inspected.items():
            problems = hardening_problems(info, root)
            assert not problems, f"container {ident[:12]} ({info.get('Name')}): {problems}"
    finally:
        watcher.remove_all()


# -- events ------------------------------------------------------------------------------------


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def texts(events: list[StreamEvent]) -> str:
    """Everything the harness said in a turn, as one string (for assertions on its output)."""
    return "\n".join(json.dumps(e.data, ensure_ascii=False) for e in events)


# -- finding a secret ----------------------------------------------------------------------------


def leak_forms(secret: str) -> set[str]:
    """The secret as it could appear in a dump: plain, JSON-escaped, URL-quoted, hex, and
    base64 at each of the three byte alignments (Celery message bodies are base64)."""
    import base64
    from urllib.parse import quote

    raw = secret.encode()
    forms = {secret, json.dumps(secret)[1:-1], quote(secret, safe=""), raw.hex()}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw + b"\0\0\0").decode()
        forms.add(encoded[4:-8])  # only the characters that depend on the secret alone
    return {form for form in forms if len(form) >= 16}


def find_leaks(secret: str, blobs: dict[str, str]) -> list[str]:
    """Names of the blobs in which any form of the secret occurs."""
    forms = leak_forms(secret)
    return sorted(name for name, blob in blobs.items() if any(form in blob for form in forms))


def dump_redis(url: str) -> dict[str, str]:
    """Every key of the database, whatever its type, as text (streams and hashes included)."""
    import redis

    r = redis.Redis.from_url(url, decode_responses=False)
    out: dict[str, str] = {}
    try:
        for key in r.scan_iter(count=1000):
            kind = r.type(key).decode()
            value: Any
            if kind == "string":
                value = r.get(key)
            elif kind == "hash":
                value = r.hgetall(key)
            elif kind == "list":
                value = r.lrange(key, 0, -1)
            elif kind == "set":
                value = r.smembers(key)
            elif kind == "zset":
                value = r.zrange(key, 0, -1, withscores=True)
            elif kind == "stream":
                value = r.xrange(key)
            else:
                continue
            out[key.decode("utf-8", "replace")] = _text(value)
    finally:
        r.close()
    return out


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return " ".join(f"{_text(k)}={_text(v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return " ".join(_text(v) for v in value)
    return str(value)


def sh(script: str) -> str:
    """A demo-harness line that runs ``script`` with /bin/sh inside the sandbox.

    The demo's ``@run`` splits its arguments on whitespace, so the script travels as hex in a
    single word; ``sh`` replaces the Python process, so ``$PPID`` is the harness itself.
    """
    code = f"import os; os.execv('/bin/sh', ['sh', '-c', {script!r}])"
    return f"@run python3 -c exec(bytes.fromhex('{code.encode().hex()}').decode())"


def py(code: str) -> str:
    """A demo-harness line that runs Python ``code`` inside the sandbox (see :func:`sh`)."""
    return f"@run python3 -c exec(bytes.fromhex('{code.encode().hex()}').decode())"
