"""LocalSandbox: a child process in its own process group, for development and tests.

No containment beyond a fresh process group, a minimal environment and a per-run working
directory: use the Docker backend for anything you do not trust.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from sandbox.base import (
    LABEL_LEASE,
    LABEL_WORKER,
    Chunk,
    ExecSpec,
    ManagedSandbox,
    Placement,
    RunSpec,
    SandboxError,
    SandboxProcesses,
    StartFailed,
)
from sandbox.pipes import Pipes
from sandbox.procs import read_group
from sandbox.small_files import rewrite_in_place
from sandbox.stdin_pipe import StdinPipe
from sandbox.store.snapshots import SnapshotStore
from sandbox.workspace import safe_name, workspace_dir

log = logging.getLogger(__name__)

PIPE_BYTES = 1024 * 1024
"""The harness's stdout pipe, widened from Linux's 64 KiB (the most an unprivileged process
may ask for by default, ``/proc/sys/fs/pipe-max-size``). The turn reads it only between
publishing what it read before: meanwhile a harness writing a flood fills the pipe and
waits, and a 64 KiB pipe made it wait often (a bare drain of `@fill`: ~350 MB/s with 64 KiB,
~510 MB/s with 1 MiB; docs/performance.md, row 6)."""
META_FILE = ".harness-run.json"


def widen_pipe(fd: int) -> None:
    """Ask for a :data:`PIPE_BYTES` pipe; one the kernel refuses (a user over its pipe quota)
    keeps its size."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


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
    """A started child process whose stdout and stderr its reader reads itself (:class:`Pipes`)."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdin: bytes | None, keep_stdin: bool = False
    ) -> None:
        self._popen = popen
        assert popen.stdout is not None and popen.stderr is not None
        self._pipes = Pipes({"stdout": popen.stdout, "stderr": popen.stderr})
        self._killed = False
        self._stdin: StdinPipe | None = None
        if popen.stdin is not None:
            pipe = popen.stdin

            def send(data: bytes) -> None:
                pipe.write(data)
                pipe.flush()

            def shut() -> None:
                with contextlib.suppress(OSError):
                    pipe.close()

            self._stdin = StdinPipe(
                send, shut, stdin or b"", keep_open=keep_stdin, name=f"local-{popen.pid}-in"
            )

    def write(self, data: bytes) -> bool:
        return self._stdin.write(data) if self._stdin is not None else False

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def eof(self) -> bool:
        return self._pipes.eof

    def read(self, timeout: float) -> Chunk | None:
        return self._pipes.read(timeout)

    def nudge(self) -> None:
        self._pipes.nudge()

    def wait(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, grace: float = 1.0) -> None:
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
        return bool(_group_members({pgid}, alive_only=True))

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _abandon(popen: subprocess.Popen[bytes]) -> None:
    """Kill a process just started whose output cannot be read, and close its pipes."""
    LocalProcess._signal_group(popen.pid, signal.SIGKILL)  # it leads its own group
    popen.wait()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _group_members(pgids: Collection[int], *, alive_only: bool = False) -> list[tuple[int, str]]:
    """(pid, cwd) of the processes in these process groups, read from /proc in one pass
    (without the cwd, and without zombies, when ``alive_only``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) not in pgids or (alive_only and fields[0] == "Z"):
                continue
            cwd = os.readlink(entry / "cwd") if not alive_only else ""
        except (OSError, ValueError, IndexError):
            continue
        members.append((int(entry.name), cwd))
    return members


def _kill_recorded_groups(meta_path: Path) -> int:
    """SIGKILL what is left of the process groups a run's turns started (see ``start``);
    returns how many processes it signalled.

    Only processes still in such a group *and* working inside the run's workspace are
    killed, so a recycled process-group id never takes an unrelated process with it.
    """
    meta = _read_meta(meta_path)
    workspace = meta.get("workspace")
    groups = {pgid for pgid in meta.get("pgids", []) if _group_exists(pgid)}
    if not groups or not workspace:
        return 0
    killed = 0
    for pid, cwd in _group_members(groups):
        if cwd.startswith(workspace):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _read_meta(path: Path) -> dict[str, Any]:
    """A run's metadata file (see ``LocalSandbox``), or {} when it is missing or unreadable
    (say, read in the instant another process rewrites it)."""
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class LocalSandbox:
    """Runs each turn as a child process in ``root/run/<run_id>`` (or a durable workspace)."""

    backend = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._processes: dict[str, set[LocalProcess]] = {}
        self._lock = threading.Lock()

    def prepare(self, spec: RunSpec) -> Placement:
        workspace = workspace_dir(self.root, spec.run_id, spec.workspace_key)
        home = workspace / ".home"
        try:
            home.mkdir(parents=True, exist_ok=True)
            (workspace / ".tmp").mkdir(exist_ok=True)
            # What earlier turns recorded stays: start() and teardown() kill what is left.
            path = self._meta_path(spec.run_id)
            recorded = _read_meta(path)
            kept: dict[str, Any] = {k: recorded[k] for k in ("workspace", "pgids") if k in recorded}
            meta: dict[str, Any] = {"run_id": spec.run_id, **dict(spec.labels), **kept}
            if meta != recorded:
                path.parent.mkdir(parents=True, exist_ok=True)
                rewrite_in_place(path, json.dumps(meta).encode())
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
        # One turn runs per run at a time, so a process an earlier turn left running is a
        # stray (say, of a worker killed mid-turn): it goes before this turn starts.
        strays = _kill_recorded_groups(self._meta_path(placement.run_id))
        if strays:
            log.warning(
                "sandbox.strays_killed", extra={"run_id": placement.run_id, "count": strays}
            )
        try:
            popen = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.PIPE
                if spec.stdin is not None or spec.keep_stdin
                else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd or placement.workspace,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StartFailed(f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}") from exc
        assert popen.stdout is not None
        widen_pipe(popen.stdout.fileno())
        try:
            process = LocalProcess(popen, spec.stdin, spec.keep_stdin)
        except (OSError, RuntimeError) as exc:  # no descriptor (or thread) left to read it with
            _abandon(popen)
            raise StartFailed(f"cannot read the output of {spec.argv[0]!r}: {exc}") from exc
        with self._lock:
            self._processes.setdefault(placement.run_id, set()).add(process)
            # Recorded so that a teardown in another process (the reaper, after this worker
            # died) can still find and stop the harness's process group.
            self._update_meta(placement.run_id, {"workspace": str(workspace)}, popen.pid)
        return process

    def _update_meta(self, run_id: str, fields: Mapping[str, str], pgid: int | None = None) -> None:
        path = self._meta_path(run_id)
        recorded = _read_meta(path)
        meta = {"run_id": run_id, **recorded, **fields}
        if pgid is not None:
            meta["pgids"] = [*meta.get("pgids", [])[-15:], pgid]
        if meta == recorded:
            return
        try:
            rewrite_in_place(path, json.dumps(meta).encode())
        except OSError as exc:
            log.warning("sandbox.meta_failed", extra={"run_id": run_id, "error": str(exc)})

    def renew(self, run_id: str, lease_until: float) -> None:
        with self._lock:
            self._update_meta(run_id, {LABEL_LEASE: str(lease_until)})

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
        SnapshotStore(self.root, run_id).remove()  # the run's record of its work goes with it
        if not keep_workspace:
            shutil.rmtree(self.root / "run" / run_id, ignore_errors=True)
        meta_path.unlink(missing_ok=True)

    def processes(self, run_id: str) -> SandboxProcesses:
        """The process groups of the run's turns running now, from ``/proc``."""
        with self._lock:
            groups = {process.pid for process in self._processes.get(run_id, set())}
        return read_group(groups)

    def diagnose(self, run_id: str) -> str | None:
        workspace = self.root / "run" / safe_name(run_id, "run id")
        if not workspace.exists() and not self._meta_path(run_id).exists():
            return f"the workspace of run {run_id} is gone"
        return None

    def managed(self) -> list[ManagedSandbox]:
        found: list[ManagedSandbox] = []
        for path in sorted((self.root / "run").glob("*.json")):
            meta = _read_meta(path)
            if not meta:
                continue
            lease = meta.get(LABEL_LEASE)
            found.append(
                ManagedSandbox(
                    run_id=str(meta.get("run_id", path.stem)),
                    ident=str(path.with_suffix("")),
                    lease_until=float(lease) if lease else None,
                    worker=meta.get(LABEL_WORKER),
                )
            )
        return found
