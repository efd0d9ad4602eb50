"""LocalSandbox: a child process in its own process group, for development and tests.

No containment beyond a fresh process group, a minimal environment and a per-run working
directory: use the Docker backend for anything you do not trust.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from sandbox.base import (
    Chunk,
    ExecSpec,
    ManagedSandbox,
    Placement,
    RunSpec,
    SandboxError,
    StartFailed,
)
from sandbox.chunks import ChunkQueue

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_READ_SIZE = 256 * 1024
"""Output read but not yet taken by ``read()``, at most (plus one read). Past it the pumps
stop reading, the pipe fills and the harness blocks in its writes: a harness that writes
faster than its output is published waits for it instead of filling the worker's memory."""
META_FILE = ".harness-run.json"


def safe_name(value: str, what: str) -> str:
    """Refuse anything that could leave its directory or confuse a path."""
    if not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise SandboxError(f"invalid {what} {value!r}: use letters, digits, '_', '.', '-'")
    return value


def minimal_env(home: str, tmpdir: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The harness environment: a small allowlist, then the command's and granted values."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TMPDIR": tmpdir,
    }
    env.update(extra)
    return env


class LocalProcess:
    """A started child process whose stdout and stderr arrive as chunks on a queue."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: bytes | None) -> None:
        self._popen = popen
        self._chunks = ChunkQueue(streams=2)
        self._killed = False
        self._threads = [
            threading.Thread(target=self._pump, args=(popen.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(popen.stderr, "stderr"), daemon=True),
        ]
        if popen.stdin is not None:
            self._threads.append(
                threading.Thread(target=self._feed, args=(popen.stdin, stdin or b""), daemon=True)
            )
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def eof(self) -> bool:
        return self._chunks.eof

    def read(self, timeout: float) -> Chunk | None:
        return self._chunks.get(timeout)

    def wait(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, grace: float = 1.0) -> None:
        self._chunks.unbound()  # nobody reads after a kill: the pumps must not wait for room
        if self._killed:
            return
        pgid = self._popen.pid  # the child leads its own group (start_new_session)
        if not self._group_alive(pgid):
            self._killed = True
            return
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self._popen.poll()
            if not self._group_alive(pgid):
                break
            time.sleep(0.02)
        self._signal_group(pgid, signal.SIGKILL)
        self._popen.wait()
        self._killed = True

    def _group_alive(self, pgid: int) -> bool:
        self._popen.poll()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        # killpg(0) also succeeds for unreaped zombies (orphans whose new parent does not
        # reap them, as when the worker runs as PID 1): only living members count.
        return bool(_group_members(pgid, alive_only=True))

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _pump(self, stream: object, name: str) -> None:
        fd = stream.fileno()  # type: ignore[attr-defined]
        try:
            while True:
                data = os.read(fd, _READ_SIZE)
                if not data:
                    break
                self._chunks.put(Chunk(name, data))  # type: ignore[arg-type]
        except OSError:
            pass
        finally:
            self._chunks.close_stream()

    @staticmethod
    def _feed(stdin: object, data: bytes) -> None:
        try:
            if data:
                stdin.write(data)  # type: ignore[attr-defined]
        except (BrokenPipeError, OSError):
            pass  # the harness closed stdin early; it gets what it read
        finally:
            with contextlib.suppress(OSError):
                stdin.close()  # type: ignore[attr-defined]


def _group_members(pgid: int, *, alive_only: bool = False) -> list[tuple[int, str]]:
    """(pid, cwd) of the processes in a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or (alive_only and fields[0] == "Z"):
                continue
            cwd = os.readlink(entry / "cwd") if not alive_only else ""
        except (OSError, ValueError, IndexError):
            continue
        members.append((int(entry.name), cwd))
    return members


def _kill_recorded_groups(meta_path: Path) -> None:
    """SIGKILL what is left of the process groups a run's turns started (see ``start``).

    Only processes still in such a group *and* working inside the run's workspace are
    killed, so a recycled process-group id never takes an unrelated process with it.
    """
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return
    groups = set(meta.get("pgids", []))
    workspace = meta.get("workspace")
    if not groups or not workspace:
        return
    for pgid in groups:
        for pid, cwd in _group_members(pgid):
            if cwd.startswith(workspace):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


class LocalSandbox:
    """Runs each turn as a child process in ``root/run/<run_id>`` (or a durable workspace)."""

    backend = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._processes: dict[str, set[LocalProcess]] = {}
        self._lock = threading.Lock()

    def _workspace(self, run_id: str, workspace_key: str | None) -> Path:
        if workspace_key:
            return self.root / "durable" / safe_name(workspace_key, "workspace key")
        return self.root / "run" / safe_name(run_id, "run id")

    def prepare(self, spec: RunSpec) -> Placement:
        workspace = self._workspace(spec.run_id, spec.workspace_key)
        home = workspace / ".home"
        try:
            home.mkdir(parents=True, exist_ok=True)
            (workspace / ".tmp").mkdir(exist_ok=True)
            meta = {"run_id": spec.run_id, **dict(spec.labels)}
            (self.root / "run").mkdir(parents=True, exist_ok=True)
            self._meta_path(spec.run_id).write_text(json.dumps(meta))
        except OSError as exc:
            raise SandboxError(f"cannot create workspace {workspace}: {exc}") from exc
        return Placement("local", spec.run_id, str(workspace), str(home))

    def _meta_path(self, run_id: str) -> Path:
        return self.root / "run" / f"{safe_name(run_id, 'run id')}.json"

    def start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> LocalProcess:
        workspace = Path(placement.workspace)
        for path, content in spec.files.items():
            target = Path(path)
            if not target.is_absolute() or not target.resolve().is_relative_to(workspace.resolve()):
                raise StartFailed(f"refusing to write {path}: outside the workspace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        env = minimal_env(placement.home, str(workspace / ".tmp"), {**spec.env, **secrets})
        try:
            popen = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.PIPE if spec.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd or placement.workspace,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StartFailed(f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}") from exc
        process = LocalProcess(popen, spec.stdin)
        with self._lock:
            self._processes.setdefault(placement.run_id, set()).add(process)
            # Recorded so that a teardown in another process (the reaper, after this worker
            # died) can still find and stop the harness's process group.
            self._update_meta(placement.run_id, {"workspace": str(workspace)}, popen.pid)
        return process

    def _update_meta(self, run_id: str, fields: Mapping[str, str], pgid: int | None = None) -> None:
        path = self._meta_path(run_id)
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            meta = {"run_id": run_id}
        meta.update(fields)
        if pgid is not None:
            meta["pgids"] = [*meta.get("pgids", [])[-15:], pgid]
        try:
            path.write_text(json.dumps(meta))
        except OSError as exc:
            log.warning("sandbox.meta_failed", extra={"run_id": run_id, "error": str(exc)})

    def renew(self, run_id: str, lease_until: float) -> None:
        with self._lock:
            self._update_meta(run_id, {"harness.lease_until": str(lease_until)})

    def teardown(self, run_id: str, *, keep_workspace: bool = False) -> None:
        with self._lock:
            processes = self._processes.pop(run_id, set())
        for process in processes:
            try:
                process.kill(grace=0.5)
            except OSError as exc:
                log.warning("sandbox.kill_failed", extra={"run_id": run_id, "error": str(exc)})
        try:
            meta_path = self._meta_path(run_id)
        except SandboxError:
            return
        _kill_recorded_groups(meta_path)
        if not keep_workspace:
            shutil.rmtree(self.root / "run" / run_id, ignore_errors=True)
        meta_path.unlink(missing_ok=True)

    def diagnose(self, run_id: str) -> str | None:
        workspace = self.root / "run" / safe_name(run_id, "run id")
        if not workspace.exists() and not self._meta_path(run_id).exists():
            return f"the workspace of run {run_id} is gone"
        return None

    def managed(self) -> list[ManagedSandbox]:
        found: list[ManagedSandbox] = []
        for path in sorted((self.root / "run").glob("*.json")):
            try:
                meta = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            lease = meta.get("harness.lease_until")
            found.append(
                ManagedSandbox(
                    run_id=str(meta.get("run_id", path.stem)),
                    ident=str(path.with_suffix("")),
                    lease_until=float(lease) if lease else None,
                    worker=meta.get("harness.worker"),
                )
            )
        return found
