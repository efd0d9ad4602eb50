"""Execs in a run's container: the transport, and DockerProcess, the handle of one turn's exec.

A turn's exec runs the harness under the wrapper of container_scripts.py, which reports the
harness's pid and output pipes on stderr (a sentinel line :meth:`ExecTransport.start` consumes)
and then execs it. Exec streams are read from our own upgraded connection (docker_stream.py),
with no read timeout, stdout and stderr demultiplexed, stdin half-closed after it is written.

Stopping a turn means stopping processes inside the container, which closing our end of the
exec would not do: :meth:`DockerProcess.kill` runs a second exec that signals every process
of the turn (its session, its environment marker, or holding its output pipes), TERM then
KILL.

Docker SDK errors are translated by the sandbox's error seam, handed in as ``seam``.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sandbox.base import Chunk, SandboxError, SandboxGone, StartFailed
from sandbox.chunks import ChunkQueue
from sandbox.docker.raw_api import RawApi
from sandbox.docker.scripts import (
    MARKER_ENV,
    SENTINEL,
    killer_argv,
    parse_sentinel,
    wrapper_argv,
)
from sandbox.docker.stream import STDOUT, DaemonRefused, RawEndpoint, frames, open_exec_stream
from sandbox.stdin_pipe import StdinPipe
from sandbox.threads import start_thread

log = logging.getLogger(__name__)

GONE_HINT = "the run's container was removed or stopped: tear the run down and start it again"

_START_TIMEOUT = 60.0
"""How long start() waits for the wrapper to report that the harness is being exec'd."""
_EXIT_SETTLE = 0.5
"""After the stream ended, how long wait() gives the daemon to record the exit code."""
_KILLED = 137
"""The exit code reported for a turn whose container disappeared under it (as if SIGKILL)."""

Frames = Iterator[tuple[int, bytes]]


class Seam(Protocol):
    """Translates Docker SDK and transport errors raised in its block into SandboxError."""

    def __call__(
        self, action: str, *, run_id: str | None = None, image: str | None = None
    ) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class Started:
    """What the wrapper reported before exec'ing the harness, and output that came early."""

    pid: int
    strays: int
    """Processes of earlier turns the wrapper killed first."""
    pipes: tuple[str, ...]
    pending: list[Chunk]


class ExecTransport:
    """Creates, streams and inspects execs through the Docker API of ``client()``."""

    def __init__(
        self,
        client: Callable[[], Any],
        seam: Seam,
        raw: RawEndpoint | None,
        api_timeout: float,
    ) -> None:
        self._client = client
        self._seam = seam
        self._raw = raw
        self._api_timeout = api_timeout
        self._api = (
            None if raw is None else RawApi(raw, lambda: str(client().api.api_version), api_timeout)
        )

    @property
    def api(self) -> RawApi | None:
        """Our own client of the daemon (None for TLS and SSH daemons: the SDK's alone)."""
        return self._api

    def start(
        self,
        container: str,
        cwd: str,
        argv: tuple[str, ...],
        *,
        env: Mapping[str, str],
        stdin: bytes | None,
        run_id: str,
        keep_stdin: bool = False,
    ) -> DockerProcess:
        """Start ``argv`` under the wrapper with ``env`` and the turn's marker; returns once
        the harness is being exec'd."""
        marker = uuid.uuid4().hex
        env = {**env, MARKER_ENV: marker}
        for key, value in env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise StartFailed(f"invalid environment variable name or value for {key!r}")
        exec_id = self.create(
            container,
            wrapper_argv(cwd, argv),
            env=env,
            stdin=stdin is not None or keep_stdin,
            run_id=run_id,
            action="start the harness",
        )
        sock, stream = self.stream(exec_id, run_id=run_id)
        try:
            started = self._await_sentinel(sock, stream, exec_id, run_id)
        except BaseException:
            sock.close()
            self._kill_marker(container, marker)
            raise
        return DockerProcess(
            self, container, exec_id, marker, started, sock, stream, stdin, keep_stdin
        )

    def run(
        self,
        container: str,
        argv: list[str],
        *,
        action: str,
        stdin: bytes | None = None,
        run_id: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run a helper command in the container to its end: (exit code, stdout, stderr)."""
        exec_id = self.create(
            container, argv, stdin=stdin is not None, run_id=run_id, action=action
        )
        sock, stream = self.stream(exec_id, run_id=run_id)
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
            info = self.inspect(exec_id)
            if not info.get("Running") or time.monotonic() > deadline:
                code = info.get("ExitCode")
                return (int(code) if isinstance(code, int) else -1), bytes(out), bytes(err)
            time.sleep(0.01)

    def create(
        self,
        container: str,
        argv: list[str],
        *,
        action: str,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        run_id: str | None = None,
    ) -> str:
        if self._api is not None:
            with self._seam(action, run_id=run_id):
                return self._api.exec_create(container, argv, env=env, stdin=stdin, workdir="/")
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

    def stream(self, exec_id: str, *, run_id: str | None = None) -> tuple[socket.socket, Frames]:
        """Start the exec and return its connection and its demultiplexed frames."""
        if self._raw is not None:
            # OSError is left to the seam: the daemon is unreachable.
            with self._seam("start an exec", run_id=run_id):
                api_version = str(self._client().api.api_version)
                try:
                    sock, initial = open_exec_stream(
                        self._raw, api_version, exec_id, self._api_timeout
                    )
                except DaemonRefused as exc:
                    if exc.status in (404, 409):
                        raise SandboxGone(
                            f"the container of run {run_id} is gone: {exc}", hint=GONE_HINT
                        ) from exc
                    raise SandboxError(f"Docker refused to start the exec: {exc}") from exc
            return sock, frames(sock, initial)
        with self._seam("start an exec", run_id=run_id):
            wrapped = self._client().api.exec_start(exec_id, socket=True)
        sock = cast(socket.socket, getattr(wrapped, "_sock", wrapped))
        sock.settimeout(None)
        return sock, frames(sock)

    def inspect(self, exec_id: str) -> dict[str, Any]:
        with self._seam("inspect an exec"):
            if self._api is not None:
                return self._api.exec_inspect(exec_id)
            return cast(dict[str, Any], self._client().api.exec_inspect(exec_id))

    def _await_sentinel(
        self, sock: socket.socket, stream: Frames, exec_id: str, run_id: str
    ) -> Started:
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
                at = stderr.find(SENTINEL)
                end = stderr.find(b"\n", at) if at >= 0 else -1
                if end >= 0:
                    sock.settimeout(None)
                    line = stderr[at + len(SENTINEL) : end].decode("ascii", "replace")
                    pid, strays, pipes = parse_sentinel(line)
                    pending = []
                    if stdout:
                        pending.append(Chunk("stdout", bytes(stdout)))
                    if end + 1 < len(stderr):
                        pending.append(Chunk("stderr", bytes(stderr[end + 1 :])))
                    return Started(pid, strays, pipes, pending)
        except TimeoutError:
            raise StartFailed(
                f"the harness of run {run_id} did not start within {_START_TIMEOUT:g}s",
                hint="the Docker host may be overloaded",
            ) from None
        except OSError as exc:
            raise SandboxGone(
                f"lost the exec stream of run {run_id}: {exc}", hint=GONE_HINT
            ) from exc
        code = self.inspect(exec_id).get("ExitCode")
        message = (bytes(stdout) + bytes(stderr)).decode("utf-8", "replace").strip()
        raise StartFailed(
            f"the harness did not start in run {run_id} (exit code {code}): "
            f"{message or 'no output'}"
        )

    def _kill_marker(self, container: str, marker: str) -> None:
        try:
            self.run(
                container, killer_argv(-1, marker, (), 0), action="kill a turn that did not start"
            )
        except SandboxError as exc:
            log.warning("sandbox.kill_failed", extra={"container": container, "error": str(exc)})


class DockerProcess:
    """One turn's exec. Output chunks arrive on a queue fed by a reader thread."""

    def __init__(
        self,
        transport: ExecTransport,
        container: str,
        exec_id: str,
        marker: str,
        started: Started,
        sock: socket.socket,
        stream: Frames,
        stdin: bytes | None,
        keep_stdin: bool = False,
    ) -> None:
        self._transport = transport
        self.container = container
        self.exec_id = exec_id
        self.marker = marker
        self.pid = started.pid
        """The harness's pid inside the container."""
        self.strays = started.strays
        """Processes of earlier turns killed before the harness started."""
        self._pipes = started.pipes
        self._sock = sock
        self._chunks = ChunkQueue(streams=1)
        for chunk in started.pending:
            self._chunks.put(chunk)
        self._stream_done = threading.Event()
        self._exit_code: int | None = None
        self._killed = False
        self._kill_lock = threading.Lock()
        start_thread(functools.partial(self._pump, stream), f"exec-{exec_id[:12]}-out")
        self._stdin: StdinPipe | None = None
        if stdin is not None or keep_stdin:
            self._stdin = StdinPipe(
                sock.sendall,
                self._shut_stdin,
                stdin or b"",
                keep_open=keep_stdin,
                name=f"exec-{exec_id[:12]}-in",
            )

    def write(self, data: bytes) -> bool:
        return self._stdin.write(data) if self._stdin is not None else False

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    @property
    def eof(self) -> bool:
        return self._chunks.eof

    def read(self, timeout: float) -> Chunk | None:
        return self._chunks.get(timeout)

    def nudge(self) -> None:
        self._chunks.nudge()

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
        pause = 0.001  # the daemon usually records the exit within a few ms of the stream's end
        while True:
            code = self._inspect()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def kill(self, grace: float = 1.0) -> None:
        """SIGTERM the harness and its children inside the container, SIGKILL after ``grace``.

        Closing our end of the exec would not stop anything in the container, so a small
        script runs in the container as the same user and signals every process of the
        turn's session or carrying the turn's marker (see ``container_scripts``). Idempotent;
        a container that is already gone has nothing left to kill.
        """
        self._chunks.unbound()  # nobody reads after a kill: the reader must not wait for room
        with self._kill_lock:
            if self._killed:
                return
            try:
                code, _, err = self._transport.run(
                    self.container,
                    killer_argv(self.pid, self.marker, self._pipes, grace),
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
            info = self._transport.inspect(self.exec_id)
        except SandboxGone:
            self._exit_code = _KILLED
            return self._exit_code
        if info.get("Running"):
            return None
        code = info.get("ExitCode")
        self._exit_code = int(code) if isinstance(code, int) and code >= 0 else _KILLED
        return self._exit_code

    def _pump(self, stream: Frames) -> None:
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

    def _shut_stdin(self) -> None:
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)  # the harness reads EOF
