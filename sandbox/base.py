"""The sandbox boundary: where a harness command runs.

A *run* gets one sandbox (a container, or a directory for the local backend) that lives
across its turns; each *turn* is one process started in it. The worker owns the lifecycle:

- ``prepare(spec)`` creates the run's sandbox, or finds the existing one, and returns its
  :class:`Placement`. Idempotent: calling it again for the same run returns the same sandbox.
- ``start(placement, spec, secrets)`` starts one process and returns a :class:`Process`.
  Files in ``spec.files`` are written first. ``secrets`` (granted values) go only into the
  process environment: never into argv, container create arguments, labels or logs.
- ``teardown(run_id, keep_workspace=...)`` kills anything still running, removes the sandbox
  and, unless asked to keep it, the workspace. Idempotent; it logs failures and never raises,
  because it runs in ``finally`` blocks on every exit path.

A :class:`Process` is owned by whoever started it, who must call ``kill()`` (idempotent) on
every path; ``kill`` stops the harness process *and its children inside the sandbox*,
SIGTERM first and SIGKILL after ``grace`` seconds. Nothing here has a timeout of its own:
``read(timeout)`` only bounds one wait, and turn and idle timeouts belong to the worker.

Exceptions that escape the boundary are the :class:`SandboxError` tree below; every foreign
error (Docker SDK, OS) is translated at the seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

NetworkPolicy = Literal["none", "bridge", "host", "egress"]
"""``egress``: only the hosts of the run's allowlist, through the egress gateway
(:mod:`sandbox.docker.egress`)."""


class SandboxError(Exception):
    """A sandbox could not do what was asked. ``hint`` says what an operator can do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class SandboxUnavailable(SandboxError):
    """The backend itself is unreachable (for example the Docker daemon is down)."""


class ImageMissing(SandboxError):
    """The image for the run does not exist on this host."""


class SandboxGone(SandboxError):
    """The run's sandbox disappeared (removed, crashed, OOM-killed)."""


class StartFailed(SandboxError):
    """The harness process could not be started (missing binary, bad working directory)."""


@dataclass(frozen=True)
class ExecSpec:
    """One process to start: argv (never a shell string), stdin bytes then EOF (None closes
    stdin at once), non-secret environment, files to write first (absolute sandbox paths),
    and the working directory (default: the workspace). With ``keep_stdin`` stdin stays
    open after ``stdin`` for :meth:`Process.write` until :meth:`Process.close_stdin`."""

    argv: tuple[str, ...]
    stdin: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    keep_stdin: bool = False


@dataclass(frozen=True)
class Limits:
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 512


@dataclass(frozen=True)
class RunSpec:
    """What the worker decided for one run's sandbox."""

    run_id: str
    image: str | None = None
    network: NetworkPolicy = "none"
    limits: Limits = field(default_factory=Limits)
    user: str = "1000:1000"
    read_only_root: bool = True
    workspace_key: str | None = None
    """A durable workspace name shared across runs (for cross-run resume); None = run-scoped."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels (worker, lease) for finding orphans; never secrets."""


@dataclass(frozen=True)
class Placement:
    """Where a run's turns execute, as stored in the run record."""

    backend: Literal["docker", "local"]
    run_id: str
    workspace: str
    """The workspace path as the harness sees it."""
    home: str
    """HOME as the harness sees it: inside the workspace, so session stores survive turns."""
    container_id: str | None = None


@dataclass(frozen=True)
class Chunk:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ManagedSandbox:
    """A sandbox this backend created, as the reaper sees it."""

    run_id: str
    ident: str
    lease_until: float | None
    worker: str | None


class Process(Protocol):
    @property
    def eof(self) -> bool:
        """True once stdout and stderr are both closed and every chunk has been read."""

    def read(self, timeout: float) -> Chunk | None:
        """The next chunk of output, or None if none arrived within ``timeout`` seconds."""

    def wait(self, timeout: float) -> int | None:
        """The exit code once the process has exited, or None if it is still running."""

    def kill(self, grace: float = 1.0) -> None:
        """Stop the process and its children: SIGTERM, then SIGKILL after ``grace``. Idempotent."""

    def write(self, data: bytes) -> bool:
        """Queue ``data`` for the harness's stdin (a ``keep_stdin`` spec), in order, without
        blocking. False when stdin is closed or broken (a write failed: the harness stopped
        reading), so nothing more reaches it. Never raises."""

    def close_stdin(self) -> None:
        """End the harness's stdin after what is queued (it reads EOF). Idempotent."""


class Sandbox(Protocol):
    backend: str
    root: Path
    """Where the backend keeps workspaces, leases and snapshots on this host."""

    def prepare(self, spec: RunSpec) -> Placement: ...

    def start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> Process: ...

    def renew(self, run_id: str, lease_until: float) -> None:
        """Extend the run's lease so the reaper leaves it alone."""

    def teardown(self, run_id: str, *, keep_workspace: bool = False) -> None: ...

    def managed(self) -> list[ManagedSandbox]:
        """Every sandbox this backend created on this host, for the reaper."""

    def diagnose(self, run_id: str) -> str | None:
        """Why the run's sandbox cannot run turns (gone, OOM-killed, daemon down), or None."""


@runtime_checkable
class WarmPool(Protocol):
    """A backend that keeps started, unclaimed sandboxes for new runs to claim (optional).

    Callers check for it with ``isinstance(sandbox, WarmPool)``; a backend without one has
    nothing to warm or drain.
    """

    def warm(self, spec: RunSpec) -> int:
        """Start sandboxes shaped as ``spec`` (its run id is ignored) until the pool is full;
        returns how many it started. Raises the :class:`SandboxError` tree."""

    def close_pool(self) -> None:
        """Stop warming and remove the unclaimed sandboxes (worker shutdown)."""

    def image_exists(self, image: str) -> bool:
        """Whether ``image`` is on this host, so a pool of it can be warmed at all."""
