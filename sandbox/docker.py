"""DockerSandbox: one container per run, one exec per turn, through the Docker SDK.

A run's container (``harness-run-<run_id>``) is created from the run's image by
:meth:`DockerSandbox.prepare` and kept alive between turns by ``sleep infinity`` under
Docker's init (``init=True``, which also reaps orphaned harness children). Each turn is one
``exec`` whose stdout and stderr are streamed, separated, as the harness writes them.

Hardening, from the :class:`~sandbox.base.RunSpec`: a non-root numeric user, every capability
dropped, ``no-new-privileges``, a read-only root with a tmpfs ``/tmp`` owned by that user,
pids, memory (swap included) and CPU limits, and the network policy (``none``, ``bridge`` or
``host``). Never privileged; the only host path in the container is the run's workspace,
``<root>/run/<run_id>`` or ``<root>/durable/<workspace_key>``, bind-mounted at
``/workspace`` and owned by the container user; HOME is ``/workspace/.home``. An image may
name a skeleton HOME in its label ``harness.home_skeleton`` (the CLI image pre-seeds
OpenCode's provider package there, so it runs offline): a fresh HOME is filled from it.

The lease: Docker labels cannot change after creation, so the lease given at creation is the
label ``harness.lease_until`` and every :meth:`renew` writes ``<root>/leases/<run_id>.json``
(outside the workspace, where the harness cannot extend its own lease); :meth:`managed`
reports the later of the two.

A run's later turns do not ask the daemon for its container again: prepare() answers from
what this sandbox remembers (sandbox/placements.py), and the turn's exec is the check; a
container that was removed or stopped meanwhile is then found, restarted or recreated as a
lookup would have, and the turn started there.

A new container is probed with one exec before prepare() returns (it runs, has /bin/sh, and
the user can write the workspace), so a broken image fails there, as StartFailed, with the
container and a new workspace removed again.

Each turn runs under a small sh wrapper that reports the harness's pid and output pipes on
stderr (a sentinel line start() consumes) and then execs the harness. Stopping a turn means
stopping processes inside the container, which closing our end of the exec would not do:
``DockerProcess.kill`` runs a second exec that signals every process of the turn (its
session, its environment marker, or holding its output pipes), TERM then KILL; see
``_KILLER``. Exec streams are read from our own upgraded connection (docker_stream.py), with
no read timeout, stdout and stderr demultiplexed, stdin half-closed after it is written.

Secrets reach only the environment of the turn's exec. They are never in the container's
create arguments, labels, command, or our logs, so ``docker inspect`` does not show them.

Every Docker SDK and ``requests`` error is translated here into the ``SandboxError`` tree:
:class:`SandboxUnavailable` (daemon unreachable), :class:`ImageMissing`,
:class:`SandboxGone` (the container was removed or stopped), :class:`StartFailed`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import shutil
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import docker.errors
import requests.exceptions
from docker.client import DockerClient, from_env
from docker.types import Mount

from sandbox.base import (
    Chunk,
    ExecSpec,
    ImageMissing,
    ManagedSandbox,
    Placement,
    RunSpec,
    SandboxError,
    SandboxGone,
    SandboxUnavailable,
    StartFailed,
)
from sandbox.chunks import ChunkQueue
from sandbox.docker_stream import (
    STDOUT,
    ExecStreamError,
    RawEndpoint,
    frames,
    open_exec_stream,
)
from sandbox.local import safe_name
from sandbox.placements import KnownPlacements

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
HOME = "/workspace/.home"
NAME_PREFIX = "harness-run-"
LABEL_MANAGED = "harness.managed"
LABEL_RUN = "harness.run_id"
LABEL_LEASE = "harness.lease_until"
LABEL_WORKER = "harness.worker"
LABEL_SCOPE = "harness.scope"
LABEL_HOME_SKELETON = "harness.home_skeleton"
LABEL_POOL_SHAPE = "harness.pool_shape"
POOL_PREFIX = "pool-"
"""Run ids of warm containers not yet claimed by a run (real run ids never start so)."""
POOL_TTL_S = 3600.0
MARKER_ENV = "HARNESS_EXEC_ID"
"""Set in every turn's environment; the kill script finds the turn's processes by it."""

BUILD_HINT = "run scripts/build-images to build the harness images on this host"
DAEMON_HINT = "start dockerd (scripts/ensure-docker) or point the worker at a running daemon"
GONE_HINT = "the run's container was removed or stopped: tear the run down and start it again"

_START_TIMEOUT = 60.0
"""How long start() waits for the wrapper to report that the harness is being exec'd."""
_EXIT_SETTLE = 0.5
"""After the stream ended, how long wait() gives the daemon to record the exit code."""
_KILLED = 137
"""The exit code reported for a turn whose container disappeared under it (as if SIGKILL)."""
_SENTINEL = b"\x1eharness-exec "

# The turn's command runs under this POSIX sh wrapper; user input reaches it only as
# positional arguments ($1 the working directory, then the argv), never inside the script.
# It checks what it can before the harness starts (so start() can raise StartFailed), then
# prints a sentinel on stderr, its pid and the identities of its stdout and stderr pipes, and
# execs the harness, which keeps that pid. Docker starts every exec as a session and
# process-group leader (runc calls setsid), so the harness leads its own session.
_WRAPPER = r"""cd -- "$1" 2>/dev/null || {
    echo "harness-exec: cannot enter the working directory $1" >&2; exit 126; }
shift
command -v -- "$1" >/dev/null 2>&1 || { echo "harness-exec: $1: command not found" >&2; exit 127; }
pipes=$(readlink "/proc/$$/fd/1" "/proc/$$/fd/2" 2>/dev/null)
printf '\036harness-exec %s %s %s\n' "$$" $pipes >&2
exec "$@"
"""

# Kills a turn's processes inside the container. A process belongs to the turn when its
# session or process group is the harness's pid ($1), when its environment carries the turn's
# marker ($2; children that start a session of their own keep it), or when it holds the
# turn's stdout or stderr pipe ($3, $4 as find -lname patterns; these also keep the exec's
# stream open). SIGTERM, up to $5 centiseconds for them to exit, then SIGKILL until none is
# left. It runs as the container user, like the harness (all capabilities are dropped, so
# root could not signal it anyway), and needs sh, grep, find, cut, sleep and /proc only.
_KILLER = r"""leader=$1 marker=$2 out=$3 err=$4 grace=$5
members() {
    for d in /proc/[0-9]*; do
        read -r stat 2>/dev/null <"$d/stat" || continue
        set -- ${stat##*") "}
        [ "$1" != Z ] && { [ "$3" = "$leader" ] || [ "$4" = "$leader" ]; } && echo "${d#/proc/}"
    done
    grep -lzx -- "$marker" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
    find /proc/[0-9]*/fd -maxdepth 1 \( -lname "$out" -o -lname "$err" \) 2>/dev/null |
        cut -d/ -f3
}
now() { read -r up _ </proc/uptime; cs=$((${up%.*} * 100 + 1${up#*.} - 100)); }
pids=$(members)
[ -n "$pids" ] || exit 0
now
end=$((cs + grace))
kill -TERM $pids 2>/dev/null
while now && [ "$cs" -lt "$end" ]; do
    sleep 0.05
    pids=$(members)
    [ -n "$pids" ] || exit 0
done
i=0
while [ "$i" -lt 40 ]; do
    pids=$(members)
    [ -n "$pids" ] || exit 0
    kill -KILL $pids 2>/dev/null
    sleep 0.05
    i=$((i + 1))
done
echo "harness-kill: still running: $pids" >&2
exit 1
"""


_PROBE = r"""for d in "$@"; do
    [ -w "$d" ] || { echo "$d is not writable by uid $(id -u)" >&2; exit 1; }
done
"""


def _killer_argv(leader: int, marker: str, pipes: tuple[str, ...], grace: float) -> list[str]:
    patterns = [_glob_escape(p) if p.startswith("pipe:") else "-" for p in pipes[:2]]
    patterns += ["-"] * (2 - len(patterns))  # "-" matches no link target
    return [
        "/bin/sh",
        "-c",
        _KILLER,
        "harness-kill",
        str(leader),
        f"{MARKER_ENV}={marker}",
        *patterns,
        str(max(0, round(grace * 100))),
    ]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "[]*?\\" else c for c in text)


@dataclass(frozen=True)
class _Started:
    """What the wrapper reported before exec'ing the harness, and output that came early."""

    pid: int
    pipes: tuple[str, ...]
    pending: list[Chunk]


def _pool_shape(spec: RunSpec) -> str:
    """What must match for a warm container to serve a run."""
    limits = spec.limits
    key = [
        spec.image,
        spec.network,
        limits.memory,
        limits.cpus,
        limits.pids,
        spec.user,
        spec.read_only_root,
    ]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def container_name(run_id: str) -> str:
    return NAME_PREFIX + safe_name(run_id, "run id")


def _parse_user(user: str) -> tuple[int, int]:
    uid_text, _, gid_text = user.partition(":")
    try:
        uid = int(uid_text)
        gid = int(gid_text) if gid_text else uid
    except ValueError:
        raise SandboxError(
            f"invalid container user {user!r}: use a numeric uid or uid:gid such as 1000:1000"
        ) from None
    if uid == 0 or gid == 0:
        raise SandboxError(f"refusing to run the harness as root (user {user!r})")
    return uid, gid


def _files_archive(files: Mapping[str, str], workspace: str) -> bytes:
    """A tar of ``files`` relative to /, after refusing any path outside the workspace."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for path, content in files.items():
            normal = posixpath.normpath(path)
            if (
                not path.startswith("/")
                or "\0" in path
                or not normal.startswith(workspace.rstrip("/") + "/")
            ):
                raise StartFailed(f"refusing to write {path!r}: files go under {workspace}/")
            data = content.encode("utf-8")
            info = tarfile.TarInfo(normal.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(now)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class DockerProcess:
    """One turn's exec. Output chunks arrive on a queue fed by a reader thread."""

    def __init__(
        self,
        sandbox: DockerSandbox,
        container: str,
        exec_id: str,
        marker: str,
        started: _Started,
        sock: socket.socket,
        stream: Iterator[tuple[int, bytes]],
        stdin: bytes | None,
    ) -> None:
        self._sandbox = sandbox
        self.container = container
        self.exec_id = exec_id
        self.marker = marker
        self.pid = started.pid
        """The harness's pid inside the container."""
        self._pipes = started.pipes
        self._sock = sock
        self._chunks = ChunkQueue(streams=1)
        for chunk in started.pending:
            self._chunks.put(chunk)
        self._stream_done = threading.Event()
        self._exit_code: int | None = None
        self._killed = False
        self._kill_lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._pump, args=(stream,), name=f"exec-{exec_id[:12]}-out", daemon=True
        )
        self._reader.start()
        if stdin is not None:
            threading.Thread(
                target=self._feed, args=(stdin,), name=f"exec-{exec_id[:12]}-in", daemon=True
            ).start()

    @property
    def eof(self) -> bool:
        return self._chunks.eof

    def read(self, timeout: float) -> Chunk | None:
        return self._chunks.get(timeout)

    def wait(self, timeout: float) -> int | None:
        """The exit code from the daemon once the exec ended.

        While the stream is open the harness (or a child holding its output) is still there;
        once it closed, the daemon is given up to half a second to record the exit status,
        whatever ``timeout`` says. A turn whose container disappeared reports 137.
        """
        if self._exit_code is not None:
            return self._exit_code
        if not self._stream_done.wait(max(timeout, 0.0)):
            return self._inspect()
        deadline = time.monotonic() + max(timeout, _EXIT_SETTLE)
        while True:
            code = self._inspect()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.01)

    def kill(self, grace: float = 1.0) -> None:
        """SIGTERM the harness and its children inside the container, SIGKILL after ``grace``.

        Closing our end of the exec would not stop anything in the container, so a small
        script runs in the container as the same user and signals every process of the
        turn's session or carrying the turn's marker (see ``_KILLER``). Idempotent; a
        container that is already gone has nothing left to kill.
        """
        self._chunks.unbound()  # nobody reads after a kill: the reader must not wait for room
        with self._kill_lock:
            if self._killed:
                return
            try:
                code, _, err = self._sandbox._run(
                    self.container,
                    _killer_argv(self.pid, self.marker, self._pipes, grace),
                    action="kill a turn",
                )
            except SandboxGone:
                code, err = 0, b""
            if code != 0:
                log.warning(
                    "sandbox.kill_incomplete",
                    extra={
                        "container": self.container,
                        "exit_code": code,
                        "stderr": err.decode("utf-8", "replace")[-500:],
                    },
                )
            self._killed = True
        # The stream ends once the last holder of the harness's output is gone.
        if not self._stream_done.wait(2.0):
            self.close()

    def close(self) -> None:
        """Drop our end of the exec stream (the process in the container is not affected)."""
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _inspect(self) -> int | None:
        try:
            info = self._sandbox._exec_inspect(self.exec_id)
        except SandboxGone:
            self._exit_code = _KILLED
            return self._exit_code
        if info.get("Running"):
            return None
        code = info.get("ExitCode")
        self._exit_code = int(code) if isinstance(code, int) and code >= 0 else _KILLED
        return self._exit_code

    def _pump(self, stream: Iterator[tuple[int, bytes]]) -> None:
        try:
            for kind, data in stream:
                self._chunks.put(Chunk("stdout" if kind == STDOUT else "stderr", data))
        except OSError:
            pass  # the connection dropped: the container or the daemon went away
        finally:
            self._chunks.close_stream()
            self._stream_done.set()
            with suppress(OSError):
                self._sock.close()

    def _feed(self, data: bytes) -> None:
        try:
            if data:
                self._sock.sendall(data)
            self._sock.shutdown(socket.SHUT_WR)  # the harness reads EOF
        except OSError:
            pass  # the harness exited (or closed stdin) before reading everything


class DockerSandbox:
    """The Docker backend: see the module docstring. ``root`` holds workspaces and leases."""

    backend = "docker"

    def __init__(
        self,
        root: Path,
        *,
        base_url: str | None = None,
        api_timeout: float = 60.0,
        scope: str = "default",
        warm_pool: int = 0,
    ) -> None:
        self.root = Path(root)
        self.scope = safe_name(scope, "scope")
        """Label value that separates deployments sharing one daemon (say, tests and a dev
        worker): :meth:`managed` lists only this scope's containers, so one deployment's
        reaper never removes another's."""
        self.base_url = base_url
        self.api_timeout = api_timeout
        self.warm_pool = warm_pool
        self._pool_closed = threading.Event()
        """How many started, unclaimed containers to keep per shape (image, network, limits,
        user): a run's first turn claims one instead of creating and starting its own."""
        url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._url = url
        tls = bool(os.environ.get("DOCKER_TLS_VERIFY")) and not base_url
        self._raw = None if tls else RawEndpoint.parse(url)
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._processes: dict[str, set[DockerProcess]] = {}
        self._placements = KnownPlacements()
        self._lock = threading.Lock()

    # -- health ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise :class:`SandboxUnavailable` unless the daemon answers."""
        with self._seam("ping the daemon"):
            self._client().ping()

    def image_exists(self, image: str) -> bool:
        with self._seam("look up an image", image=image):
            try:
                self._client().images.get(image)
            except docker.errors.ImageNotFound:
                return False
        return True

    # -- the Sandbox protocol -------------------------------------------------------------

    def prepare(self, spec: RunSpec) -> Placement:
        if not spec.image:
            raise SandboxError(f"run {spec.run_id} has no image: the docker backend needs one")
        known = self._placements.lookup(spec)  # checked by the turn's exec (see start())
        if known is not None:
            uid, gid = _parse_user(spec.user)
            self._make_workspace(spec, uid, gid)
            return known
        placement = self._prepare_checked(spec)
        self._placements.remember(spec, placement)
        return placement

    def _prepare_checked(self, spec: RunSpec) -> Placement:
        """Find (restarting it if stopped), claim from the pool, or create the run's container."""
        name = container_name(spec.run_id)
        uid, gid = _parse_user(spec.user)
        with self._seam("find the run's container", run_id=spec.run_id):
            existing = self._find(name)
        if existing is not None:
            self._make_workspace(spec, uid, gid)
            return self._reuse(existing, spec)
        claimed = self._claim(spec)
        if claimed is not None:
            self._make_workspace(spec, uid, gid)
            self._refill_later(spec)
            return claimed
        placement = self._create(spec)
        if self.warm_pool and not spec.workspace_key:
            self._refill_later(spec)  # the pool was empty (or is new): fill it for the next run
        return placement

    def _create(self, spec: RunSpec) -> Placement:
        """Create and start the run's container (and its workspace)."""
        name = container_name(spec.run_id)
        assert spec.image is not None
        uid, gid = _parse_user(spec.user)
        client = self._client()
        with self._seam("look up the run's image", image=spec.image):
            try:
                image = client.images.get(spec.image)
            except docker.errors.ImageNotFound:
                raise ImageMissing(
                    f"image {spec.image} is not on this Docker host", hint=BUILD_HINT
                ) from None
        workspace, created_workspace, fresh_home = self._make_workspace(spec, uid, gid)
        container: Any = None
        try:
            with self._seam("create the run's container", run_id=spec.run_id, image=spec.image):
                try:
                    container = client.containers.create(**self._create_args(spec, workspace))
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        raise
                    # Another worker thread created it in the meantime: use that one.
                    found = self._find(name)
                    if found is None:
                        raise
                    return self._reuse(found, spec)
                container.start()
            self._probe(container.id)
            skeleton = (image.labels or {}).get(LABEL_HOME_SKELETON)
            if skeleton and fresh_home:
                self._copy_skeleton(container.id, skeleton)
        except BaseException as exc:
            self._undo_prepare(container, workspace if created_workspace else None)
            if isinstance(exc, SandboxError) and not isinstance(
                exc, SandboxUnavailable | ImageMissing
            ):
                raise StartFailed(
                    f"cannot start the container of run {spec.run_id}: {exc}",
                    hint="check the image and the daemon log (docker logs, journalctl -u docker)",
                ) from exc
            raise
        log.info(
            "sandbox.container_created",
            extra={"run_id": spec.run_id, "container": container.id, "image": spec.image},
        )
        return self._placement(spec.run_id, container.id)

    def start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> DockerProcess:
        if not spec.argv:
            raise StartFailed("empty command: nothing to start")
        unchecked = self._placements.take_unverified(placement.run_id)
        try:
            return self._start(placement, spec, secrets)
        except SandboxGone:
            if unchecked is None:
                raise
        # The remembered container is gone or stopped since the run's last turn: prepare the
        # run the long way, as a lookup would have, and start the turn there.
        self._placements.forget(placement.run_id)
        log.info("sandbox.container_changed", extra={"run_id": placement.run_id})
        fresh = self._prepare_checked(unchecked)
        self._placements.remember(unchecked, fresh)
        return self._start(fresh, spec, secrets)

    def _start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> DockerProcess:
        container = placement.container_id or container_name(placement.run_id)
        if spec.files:
            archive = _files_archive(spec.files, placement.workspace)
            code, _, err = self._run(
                container,
                ["tar", "-x", "-f", "-", "-C", "/"],
                stdin=archive,
                action="write the turn's files",
                run_id=placement.run_id,
            )
            if code != 0:
                raise StartFailed(
                    f"cannot write the turn's files ({', '.join(sorted(spec.files))}): "
                    f"{err.decode('utf-8', 'replace').strip()}"
                )
        marker = uuid.uuid4().hex
        env = {**spec.env, **secrets, "HOME": placement.home, MARKER_ENV: marker}
        for key, value in env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise StartFailed(f"invalid environment variable name or value for {key!r}")
        cwd = spec.cwd or placement.workspace
        argv = ["/bin/sh", "-c", _WRAPPER, "harness-exec", cwd, *spec.argv]
        exec_id = self._exec_create(
            container,
            argv,
            env=env,
            stdin=spec.stdin is not None,
            run_id=placement.run_id,
            action="start the harness",
        )
        sock, stream = self._exec_stream(exec_id, run_id=placement.run_id)
        try:
            started = self._await_sentinel(sock, stream, exec_id, placement.run_id)
        except BaseException:
            sock.close()
            self._kill_marker(container, marker)
            raise
        process = DockerProcess(self, container, exec_id, marker, started, sock, stream, spec.stdin)
        with self._lock:
            running = self._processes.setdefault(placement.run_id, set())
            running.difference_update([p for p in running if p.eof])
            running.add(process)
        log.info(
            "sandbox.exec",
            extra={
                "run_id": placement.run_id,
                "container": container,
                "exec_id": exec_id,
                "executable": spec.argv[0],
            },
        )
        return process

    def renew(self, run_id: str, lease_until: float) -> None:
        path = self._lease_path(run_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
            temporary.write_text(json.dumps({"run_id": run_id, "lease_until": lease_until}))
            temporary.replace(path)
        except OSError as exc:
            log.warning("sandbox.renew_failed", extra={"run_id": run_id, "error": str(exc)})

    def teardown(self, run_id: str, *, keep_workspace: bool = False) -> None:
        try:
            name = container_name(run_id)
        except SandboxError as exc:
            log.warning("sandbox.teardown_failed", extra={"run_id": run_id, "error": str(exc)})
            return
        self._placements.forget(run_id)
        with self._lock:
            processes = self._processes.pop(run_id, set())
        for process in processes:
            try:
                process.kill(grace=0.5)
            except SandboxError as exc:
                log.warning("sandbox.kill_failed", extra={"run_id": run_id, "error": str(exc)})
            finally:
                process.close()
        try:
            with (
                self._seam("remove the run's container", run_id=run_id),
                suppress(docker.errors.NotFound),
            ):
                container = self._client().containers.get(name)
                (self._claims_dir() / container.id).unlink(missing_ok=True)
                container.remove(force=True)
        except SandboxError as exc:
            log.warning(
                "sandbox.teardown_failed",
                extra={"run_id": run_id, "error": str(exc), "step": "remove container"},
            )
        self._lease_path(run_id).unlink(missing_ok=True)
        if not keep_workspace:
            workspace = self.root / "run" / run_id
            try:
                shutil.rmtree(workspace)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning(
                    "sandbox.teardown_failed",
                    extra={"run_id": run_id, "error": str(exc), "step": "remove workspace"},
                )

    def diagnose(self, run_id: str) -> str | None:
        """Why the run's container cannot run turns: gone, OOM-killed, stopped, daemon down."""
        try:
            with self._seam("inspect the run's container", run_id=run_id):
                container = self._find(container_name(run_id))
                if container is None:
                    return f"the container of run {run_id} is gone"
                state: dict[str, Any] = container.attrs.get("State") or {}
        except SandboxError as exc:
            return str(exc)
        limit = (container.attrs.get("HostConfig") or {}).get("Memory") or 0
        if state.get("OOMKilled"):
            shown = f" ({limit // (1024 * 1024)} MiB)" if limit else ""
            return f"the container was killed for exceeding its memory limit{shown}"
        if state.get("Status") != "running":
            return f"the container is {state.get('Status')} (exit code {state.get('ExitCode')})"
        kills = self._oom_kills(container.id, run_id)
        if kills:
            shown = f" of {limit // (1024 * 1024)} MiB" if limit else ""
            return (
                f"a process in the container was killed for exceeding its memory limit{shown} "
                f"({kills} out-of-memory kills so far)"
            )
        return None

    def _oom_kills(self, container: str, run_id: str) -> int:
        """The container's out-of-memory kill count (cgroup v1 or v2), 0 when unknown.

        An exec'd process killed by the OOM killer leaves the container running and
        ``State.OOMKilled`` false; only the memory cgroup remembers it.
        """
        script = (
            "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control"
            " 2>/dev/null; true"
        )
        try:
            _code, out, _ = self._run(
                container, ["sh", "-c", script], action="read the memory cgroup", run_id=run_id
            )
        except SandboxError:
            return 0
        for line in out.decode(errors="replace").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    # -- the warm pool ---------------------------------------------------------------------

    def warm(self, spec: RunSpec) -> int:
        """Start containers of ``spec``'s shape until ``warm_pool`` wait unclaimed; returns how
        many it started. ``spec.run_id`` is ignored."""
        shape = _pool_shape(spec)
        missing = self.warm_pool - len(self._pooled(shape))
        for _ in range(max(missing, 0)):
            if self._pool_closed.is_set():
                return 0
            labels = {
                **spec.labels,
                LABEL_POOL_SHAPE: shape,
                LABEL_LEASE: f"{time.time() + POOL_TTL_S:.0f}",
            }
            pooled = replace(
                spec, run_id=POOL_PREFIX + uuid.uuid4().hex[:16], workspace_key=None, labels=labels
            )
            self._create(pooled)
            if self._pool_closed.is_set():  # closed while this one was starting
                self.teardown(pooled.run_id)
                return 0
        return max(missing, 0)

    def close_pool(self) -> None:
        """Stop warming and remove this scope's unclaimed warm containers (worker shutdown)."""
        self._pool_closed.set()
        for found in self.managed():
            if found.run_id.startswith(POOL_PREFIX):
                self.teardown(found.run_id)

    def _refill_later(self, spec: RunSpec) -> None:
        def refill() -> None:
            try:
                self.warm(spec)
            except SandboxError as exc:
                log.warning("sandbox.pool_refill_failed", extra={"error": str(exc)})

        threading.Thread(target=refill, name="pool-refill", daemon=True).start()

    def _pooled(self, shape: str) -> list[dict[str, Any]]:
        with self._seam("list the warm containers"):
            summaries = self._client().api.containers(
                filters={
                    "label": [
                        f"{LABEL_MANAGED}=true",
                        f"{LABEL_SCOPE}={self.scope}",
                        f"{LABEL_POOL_SHAPE}={shape}",
                    ],
                    "status": "running",
                },
            )
        prefix = "/" + NAME_PREFIX + POOL_PREFIX
        return [
            s
            for s in cast(list[dict[str, Any]], summaries)
            if any(name.startswith(prefix) for name in s.get("Names") or [])
        ]

    def _claim(self, spec: RunSpec) -> Placement | None:
        """Take a warm container of the run's shape, if one waits. Several workers may race
        for the same one: moving its workspace directory is the atomic step that decides."""
        if not self.warm_pool or spec.workspace_key:
            return None
        for summary in self._pooled(_pool_shape(spec)):
            pool_run = (summary.get("Labels") or {}).get(LABEL_RUN, "")
            try:
                os.rename(self.root / "run" / pool_run, self.root / "run" / spec.run_id)
            except OSError:
                continue  # another worker claimed it first
            self._claims_dir().mkdir(parents=True, exist_ok=True)
            (self._claims_dir() / summary["Id"]).write_text(spec.run_id)
            with self._seam("claim a warm container", run_id=spec.run_id):
                self._client().api.rename(summary["Id"], container_name(spec.run_id))
            log.info(
                "sandbox.container_claimed",
                extra={"run_id": spec.run_id, "container": summary["Id"]},
            )
            return self._placement(spec.run_id, summary["Id"])
        return None

    def _claims_dir(self) -> Path:
        return self.root / "claims"

    def _claimed_run(self, container_id: str) -> str | None:
        try:
            return (self._claims_dir() / container_id).read_text().strip() or None
        except OSError:
            return None

    def managed(self) -> list[ManagedSandbox]:
        """This scope's containers on this daemon, with run id, lease and worker."""
        with self._seam("list the harness containers"):
            summaries = self._client().api.containers(
                all=True,
                filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_SCOPE}={self.scope}"]},
            )
        found: list[ManagedSandbox] = []
        for summary in cast(list[dict[str, Any]], summaries):
            labels: dict[str, str] = summary.get("Labels") or {}
            run_id = labels.get(LABEL_RUN)
            if not run_id:
                continue
            if run_id.startswith(POOL_PREFIX):
                run_id = self._claimed_run(str(summary.get("Id", ""))) or run_id
            leases = [self._label_lease(labels.get(LABEL_LEASE)), self._file_lease(run_id)]
            known = [lease for lease in leases if lease is not None]
            found.append(
                ManagedSandbox(
                    run_id=run_id,
                    ident=str(summary.get("Id", "")),
                    lease_until=max(known) if known else None,
                    worker=labels.get(LABEL_WORKER),
                )
            )
        return found

    # -- containers -----------------------------------------------------------------------

    def _create_args(self, spec: RunSpec, workspace: Path) -> dict[str, Any]:
        uid, gid = _parse_user(spec.user)
        labels = {
            **{str(k): str(v) for k, v in spec.labels.items()},
            LABEL_MANAGED: "true",
            LABEL_RUN: spec.run_id,
            LABEL_SCOPE: self.scope,
        }
        if spec.workspace_key:
            labels["harness.workspace_key"] = spec.workspace_key
        args: dict[str, Any] = {
            "image": spec.image,
            "command": ["sleep", "infinity"],
            "name": container_name(spec.run_id),
            "labels": labels,
            "init": True,
            "user": spec.user,
            "working_dir": WORKSPACE,
            "environment": {"HOME": HOME, "TMPDIR": "/tmp"},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "privileged": False,
            "read_only": spec.read_only_root,
            "pids_limit": spec.limits.pids,
            "mem_limit": spec.limits.memory,
            "memswap_limit": spec.limits.memory,
            "nano_cpus": int(spec.limits.cpus * 1e9),
            "network_mode": spec.network,
            "cgroupns": "private",
            "mounts": [Mount(target=WORKSPACE, source=str(workspace), type="bind")],
        }
        if spec.read_only_root:
            # Docker here ignores mode=1777 on a tmpfs; owning it is what lets the user write.
            args["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,uid={uid},gid={gid}"}
        return args

    def _find(self, name: str) -> Any:
        try:
            return self._client().containers.get(name)
        except docker.errors.NotFound:
            return None

    def _reuse(self, container: Any, spec: RunSpec) -> Placement:
        labels = container.labels or {}
        if labels.get(LABEL_RUN) != spec.run_id or labels.get(LABEL_MANAGED) != "true":
            raise SandboxError(
                f"a container named {container.name} exists but is not run {spec.run_id}'s",
                hint="remove it (docker rm -f) or use another run id",
            )
        if container.status != "running":
            with self._seam("restart the run's container", run_id=spec.run_id):
                try:
                    container.start()
                except docker.errors.APIError as exc:
                    raise StartFailed(
                        f"cannot restart the container of run {spec.run_id}: {exc.explanation}",
                        hint="tear the run down and start it again",
                    ) from exc
        return self._placement(spec.run_id, container.id)

    def _placement(self, run_id: str, container_id: str) -> Placement:
        return Placement("docker", run_id, WORKSPACE, HOME, container_id=container_id)

    def _make_workspace(self, spec: RunSpec, uid: int, gid: int) -> tuple[Path, bool, bool]:
        if spec.workspace_key:
            workspace = self.root / "durable" / safe_name(spec.workspace_key, "workspace key")
        else:
            workspace = self.root / "run" / safe_name(spec.run_id, "run id")
        home = workspace / ".home"
        created = not workspace.exists()
        try:
            # The harness controls everything inside the workspace: a .home it replaced with
            # a symlink (or a file) must never lead this root-run worker to a host path.
            if home.is_symlink() or (home.exists() and not home.is_dir()):
                home.unlink()
            fresh_home = not home.exists()
            home.mkdir(parents=True, exist_ok=True)
            for path in (workspace, home):
                self._own(path, uid, gid)
        except OSError as exc:
            raise SandboxError(
                f"cannot create the workspace {workspace}: {exc.strerror or exc}",
                hint="check that the workspace root is writable by the worker",
            ) from exc
        return workspace, created, fresh_home

    @staticmethod
    def _own(path: Path, uid: int, gid: int) -> None:
        stat = path.lstat()
        if (stat.st_uid, stat.st_gid) == (uid, gid):
            return
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except PermissionError:
            # A worker that is neither root nor the container's uid cannot hand the directory
            # over; opening it up is the only way the container user can write to it.
            os.chmod(path, 0o777)
            log.warning(
                "sandbox.workspace_not_owned",
                extra={"path": str(path), "uid": uid, "hint": "run the worker as root or uid"},
            )

    def _probe(self, container: str) -> None:
        """One exec right after start: the container runs (its command did not die at once),
        it has the /bin/sh our wrapper needs, and the user can write to the workspace."""
        code, _, err = self._run(
            container,
            ["/bin/sh", "-c", _PROBE, "harness-probe", WORKSPACE, HOME],
            action="check the new container",
        )
        if code != 0:
            reason = err.decode("utf-8", "replace").strip() or f"exit code {code}"
            raise StartFailed(f"the new container is not usable: {reason}")

    def _copy_skeleton(self, container: str, skeleton: str) -> None:
        code, _, err = self._run(
            container,
            ["cp", "-R", "-p", "--", skeleton.rstrip("/") + "/.", HOME + "/"],
            action="fill HOME from the image's skeleton",
        )
        if code != 0:
            raise StartFailed(
                f"cannot copy the image's HOME skeleton {skeleton}: "
                f"{err.decode('utf-8', 'replace').strip()}"
            )

    def _undo_prepare(self, container: Any, workspace: Path | None) -> None:
        if container is not None:
            try:
                container.remove(force=True)
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.warning(
                    "sandbox.cleanup_failed", extra={"container": container.id, "error": str(exc)}
                )
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)

    # -- execs ----------------------------------------------------------------------------

    def _exec_create(
        self,
        container: str,
        argv: list[str],
        *,
        action: str,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        run_id: str | None = None,
    ) -> str:
        with self._seam(action, run_id=run_id):
            created = self._client().api.exec_create(
                container,
                argv,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=dict(env) if env else None,
                workdir="/",
            )
        return str(created["Id"])

    def _exec_stream(
        self, exec_id: str, *, run_id: str | None = None
    ) -> tuple[socket.socket, Iterator[tuple[int, bytes]]]:
        if self._raw is not None:
            api = self._client().api
            try:
                sock, initial = open_exec_stream(
                    self._raw, str(api.api_version), exec_id, self.api_timeout
                )
            except ExecStreamError as exc:
                if exc.status in (404, 409):
                    raise SandboxGone(
                        f"the container of run {run_id} is gone: {exc}", hint=GONE_HINT
                    ) from exc
                raise SandboxError(f"Docker refused to start the exec: {exc}") from exc
            except OSError as exc:
                raise self._unavailable("start an exec", exc) from exc
            return sock, frames(sock, initial)
        with self._seam("start an exec", run_id=run_id):
            wrapped = self._client().api.exec_start(exec_id, socket=True)
        sock = cast(socket.socket, getattr(wrapped, "_sock", wrapped))
        sock.settimeout(None)
        return sock, frames(sock)

    def _exec_inspect(self, exec_id: str) -> dict[str, Any]:
        with self._seam("inspect an exec"):
            return cast(dict[str, Any], self._client().api.exec_inspect(exec_id))

    def _await_sentinel(
        self,
        sock: socket.socket,
        stream: Iterator[tuple[int, bytes]],
        exec_id: str,
        run_id: str,
    ) -> _Started:
        """Read until the wrapper's sentinel: the harness's pid, pipes and any early output.

        Docker copies stdout and stderr independently, so the harness's first stdout may
        arrive before the sentinel on stderr: it is kept. When no sentinel comes, what came
        instead is the wrapper's (or the daemon's) reason for not starting the harness.
        """
        stderr, stdout = bytearray(), bytearray()
        sock.settimeout(_START_TIMEOUT)
        try:
            for kind, data in stream:
                if kind == STDOUT:
                    stdout += data
                    continue
                stderr += data
                at = stderr.find(_SENTINEL)
                end = stderr.find(b"\n", at) if at >= 0 else -1
                if end >= 0:
                    sock.settimeout(None)
                    fields = stderr[at + len(_SENTINEL) : end].decode("ascii", "replace").split()
                    pending = []
                    if stdout:
                        pending.append(Chunk("stdout", bytes(stdout)))
                    if end + 1 < len(stderr):
                        pending.append(Chunk("stderr", bytes(stderr[end + 1 :])))
                    return _Started(int(fields[0]), tuple(fields[1:3]), pending)
        except TimeoutError:
            raise StartFailed(
                f"the harness of run {run_id} did not start within {_START_TIMEOUT:g}s",
                hint="the Docker host may be overloaded",
            ) from None
        except OSError as exc:
            raise SandboxGone(
                f"lost the exec stream of run {run_id}: {exc}", hint=GONE_HINT
            ) from exc
        code = self._exec_inspect(exec_id).get("ExitCode")
        message = (bytes(stdout) + bytes(stderr)).decode("utf-8", "replace").strip()
        raise StartFailed(
            f"the harness did not start in run {run_id} (exit code {code}): "
            f"{message or 'no output'}"
        )

    def _run(
        self,
        container: str,
        argv: list[str],
        *,
        action: str,
        stdin: bytes | None = None,
        run_id: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run a helper command in the container to its end: (exit code, stdout, stderr)."""
        exec_id = self._exec_create(
            container, argv, stdin=stdin is not None, run_id=run_id, action=action
        )
        sock, stream = self._exec_stream(exec_id, run_id=run_id)
        out, err = bytearray(), bytearray()
        try:
            if stdin is not None:
                sock.sendall(stdin)
                sock.shutdown(socket.SHUT_WR)
            for kind, data in stream:
                (out if kind == STDOUT else err).extend(data)
        except OSError as exc:
            raise SandboxGone(f"lost the connection while trying to {action}: {exc}") from exc
        finally:
            sock.close()
        deadline = time.monotonic() + 5.0
        while True:
            info = self._exec_inspect(exec_id)
            if not info.get("Running") or time.monotonic() > deadline:
                code = info.get("ExitCode")
                return (int(code) if isinstance(code, int) else -1), bytes(out), bytes(err)
            time.sleep(0.01)

    def _kill_marker(self, container: str, marker: str) -> None:
        try:
            self._run(
                container, _killer_argv(-1, marker, (), 0), action="kill a turn that did not start"
            )
        except SandboxError as exc:
            log.warning("sandbox.kill_failed", extra={"container": container, "error": str(exc)})

    # -- leases ---------------------------------------------------------------------------

    def _lease_path(self, run_id: str) -> Path:
        return self.root / "leases" / f"{safe_name(run_id, 'run id')}.json"

    def _file_lease(self, run_id: str) -> float | None:
        try:
            value = json.loads(self._lease_path(run_id).read_text()).get("lease_until")
        except (OSError, ValueError, AttributeError, SandboxError):
            return None
        return float(value) if isinstance(value, int | float) else None

    @staticmethod
    def _label_lease(value: str | None) -> float | None:
        try:
            return float(value) if value else None
        except ValueError:
            return None

    # -- the seam -------------------------------------------------------------------------

    def _client(self) -> Any:
        with self._client_lock:
            if self._client_obj is None:
                with self._seam("connect"):
                    if self.base_url:
                        client = DockerClient(
                            base_url=self.base_url, version="auto", timeout=self.api_timeout
                        )
                    else:
                        client = from_env(version="auto", timeout=self.api_timeout)
                self._client_obj = client
            return self._client_obj

    def _unavailable(self, action: str, exc: BaseException) -> SandboxUnavailable:
        reason = str(exc)
        if isinstance(exc, requests.exceptions.ReadTimeout):
            reason = f"no answer within {self.api_timeout:g}s"
        elif "Connection refused" in reason or "No such file" in reason:
            reason = "nothing is listening there"
        return SandboxUnavailable(
            f"cannot reach the Docker daemon at {self._url} to {action}: {reason}",
            hint=DAEMON_HINT,
        )

    @contextmanager
    def _seam(
        self, action: str, *, run_id: str | None = None, image: str | None = None
    ) -> Iterator[None]:
        """Translate Docker SDK and transport errors into the SandboxError tree."""
        try:
            yield
        except SandboxError:
            raise
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(
                f"image {image or '?'} is not on this Docker host", hint=BUILD_HINT
            ) from exc
        except docker.errors.NotFound as exc:
            raise SandboxGone(
                f"cannot {action}: the container of run {run_id or '?'} is gone "
                f"({exc.explanation})",
                hint=GONE_HINT,
            ) from exc
        except docker.errors.APIError as exc:
            explanation = str(exc.explanation or exc)
            if exc.status_code == 409 and "not running" in explanation:
                raise SandboxGone(
                    f"cannot {action}: the container of run {run_id or '?'} is not running",
                    hint=GONE_HINT,
                ) from exc
            raise SandboxError(
                f"Docker refused to {action}: {explanation}",
                hint="see the daemon log for details",
            ) from exc
        except (
            requests.exceptions.RequestException,
            docker.errors.DockerException,
            OSError,
        ) as exc:
            raise self._unavailable(action, exc) from exc
