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

Exceptions that escape the boundary are the :class:`SandboxError` tree below, the whole of
it (the backends' and the workspace store's, :mod:`sandbox.store`); every foreign error
(Docker SDK, OS, git) is translated at the seam::

    SandboxError                 a sandbox could not do what was asked (a bad name, no image)
    ├── SandboxUnavailable       the backend is unreachable (the Docker daemon is down)
    ├── ImageMissing             the run's image is not on this host
    ├── SandboxGone              the run's sandbox disappeared (removed, OOM-killed)
    ├── StartFailed              the harness process could not be started
    ├── GitError                 a git process of the store failed or timed out
    ├── UnsafePath               a workspace path could not be written without following a link
    ├── AddressRefused           a host resolves to an address that is not public
    ├── Unresolvable             a host name does not resolve (now)
    ├── SeedError                a workspace could not be seeded
    │   ├── ArchiveRefused       an archive broke a rule (invalid input)
    │   └── SeedUnreachable      the repository could not be reached now (worth retrying)
    └── SnapshotError            a snapshot operation failed
        ├── ExportTooLarge       an export would pass its ceiling
        └── UnknownSnapshot      no snapshot of that turn

Optional abilities of a backend are protocols of their own (:class:`WarmPool`,
:class:`Egress`), checked with ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

NetworkPolicy = Literal["none", "bridge", "host", "egress"]
"""``bridge``: the internet, but neither other runs, nor the host, nor private addresses
unless policy lists them; ``egress``: only the hosts of the run's allowlist, through the
egress gateway; ``host``: the host's own network (:mod:`sandbox.network`)."""


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


# The workspace store's errors (:mod:`sandbox.store`): seeding, snapshots, git, safe files.


class GitError(SandboxError):
    """A git process failed or timed out; the message carries its (redacted) stderr tail."""


class UnsafePath(SandboxError):
    """A path could not be written or removed without following a link (or at all)."""


class AddressRefused(SandboxError, ValueError):
    """A host named by a producer or a tenant resolves to an address that is not public
    (:func:`sandbox.addresses.is_public`); the message names the host and the address."""


class Unresolvable(SandboxError, OSError):
    """A host name has no address now (a later lookup may find one)."""


class SeedError(SandboxError):
    """A workspace could not be seeded. The message is safe to show a producer: it never holds
    a credential."""


class ArchiveRefused(SeedError):
    """An archive was refused (the caller maps this to ``invalid-input``); the message names the
    member and the rule it broke. Nothing was written outside the workspace, and what was
    written inside it has been removed."""


class SeedUnreachable(SeedError):
    """The repository could not be read now: its host did not resolve, did not answer, or
    failed mid-transfer (not a wrong URL or ref, not one policy refuses). A later attempt may
    succeed; nothing was left behind."""


class SnapshotError(SandboxError):
    """A snapshot operation failed; the store is unchanged unless the message says otherwise."""


class ExportTooLarge(SnapshotError):
    """An export would pass the ceiling it was given (named in the message)."""


class UnknownSnapshot(SnapshotError):
    """No snapshot of that turn in this run's store."""


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


# The labels of a run's sandbox (a container's labels; the local backend's meta file keeps
# the worker's two), by which a reaper finds it, its run and its lease. Never secrets.
LABEL_MANAGED = "harness.managed"
"""``true`` on every sandbox a backend created for a run."""
LABEL_RUN = "harness.run_id"
LABEL_SCOPE = "harness.scope"
"""The deployment that owns it (the backend's scope): a reaper lists only its own."""
LABEL_WORKSPACE_KEY = "harness.workspace_key"
"""A durable workspace's name (:attr:`RunSpec.workspace_key`), when the run has one."""
LABEL_WORKER = "harness.worker"
"""The worker that holds the run (set by the worker in :attr:`RunSpec.labels`)."""
LABEL_LEASE = "harness.lease_until"
"""Until when (unix time) the run is held, for the reaper (set by the worker in
:attr:`RunSpec.labels`, renewed by :meth:`Sandbox.renew`)."""


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
    """Extra labels (:data:`LABEL_WORKER`, :data:`LABEL_LEASE`) for finding orphans; never
    secrets."""


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

    def nudge(self) -> None:
        """Make a :meth:`read` waiting now (or the next one) return None at once: another
        thread has something for the reader to do (a message for the harness)."""


class Sandbox(Protocol):
    backend: str
    root: Path
    """Where the backend keeps workspaces, leases and snapshots on this host."""

    def prepare(self, spec: RunSpec) -> Placement:
        """Create the run's sandbox, or find the existing one (idempotent), with its
        workspace; returns where its turns run.

        Raises :class:`SandboxUnavailable` (the backend is unreachable), :class:`ImageMissing`
        (the run's image is not on this host), :class:`StartFailed` (a new sandbox came up
        unusable) or :class:`SandboxError` (a run id or workspace key that is no safe name,
        no image for a backend that needs one, a workspace or egress gateway that could not
        be made)."""

    def start(self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]) -> Process:
        """Write ``spec.files``, then start one process; the caller owns it (``kill``).

        Raises :class:`StartFailed` (an empty argv, a missing binary or working directory, a
        file outside the workspace, an invalid environment name), :class:`SandboxGone` (the
        run's sandbox is gone or stopped and could not be brought back),
        :class:`SandboxUnavailable` (the backend is unreachable) or :class:`SandboxError`
        (the backend refused the start)."""

    def renew(self, run_id: str, lease_until: float) -> None:
        """Extend the run's lease so the reaper leaves it alone."""

    def teardown(self, run_id: str, *, keep_workspace: bool = False) -> None:
        """Kill what still runs, remove the sandbox and, unless ``keep_workspace``, the
        workspace. Idempotent. Never raises: it runs in ``finally`` blocks on every exit
        path, so what fails is logged (``sandbox.teardown_failed``) and left to the
        reaper."""

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


@dataclass(frozen=True)
class Denial:
    """One refused connection attempt of a client of the egress gateway."""

    client: str
    host: str
    port: int | None
    protocol: str
    """``http`` (refused by the proxy), ``tcp``, ``udp``, ``icmp``... (rejected packets)."""
    rule: str
    """Why: ``not-allowed``, ``private-address``, ``admin`` (the proxy), ``direct`` (a
    connection that did not go through the proxy), ``dns-lookup`` (a name looked up: the
    gateway's resolver answers none)."""
    at: float | None = None

    def describe(self) -> str:
        target = f"{self.host}:{self.port}" if self.port is not None else self.host
        if self.protocol == "dns":
            return f"denied dns lookup of {self.host} ({self.rule})"
        how = "through the proxy" if self.protocol == "http" else f"direct {self.protocol}"
        return f"denied {how} {target} ({self.rule})"


SHOWN_PROCESSES = 20
SHOWN_CONNECTIONS = 10
COMMAND_CHARS = 120


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    ppid: int
    state: str
    """``R`` running, ``S`` sleeping, ``D`` in uninterruptible I/O, ``Z`` zombie, ``T``..."""
    cpu_s: float
    """CPU time used so far (user and system)."""
    command: str


@dataclass(frozen=True)
class Connection:
    local: str
    remote: str
    state: str


@dataclass(frozen=True)
class SandboxProcesses:
    """A run's sandbox at one moment: its processes and its TCP connections."""

    processes: tuple[ProcessRow, ...]
    connections: tuple[Connection, ...] = ()

    def describe(self) -> str:
        """One line per process as a tree (pid, state, CPU time, command), then the
        connections; cut at :data:`SHOWN_PROCESSES` and :data:`SHOWN_CONNECTIONS`."""
        if not self.processes:
            return "no process is running in the sandbox"
        lines = ["processes (pid state cpu command):"]
        for depth, row in _tree(self.processes)[:SHOWN_PROCESSES]:
            command = row.command[:COMMAND_CHARS]
            lines.append(f"{'  ' * (depth + 1)}{row.pid} {row.state} {row.cpu_s:.1f}s {command}")
        if len(self.processes) > SHOWN_PROCESSES:
            lines.append(f"  ... {len(self.processes) - SHOWN_PROCESSES} more")
        if self.connections:
            lines.append("connections:")
            lines.extend(
                f"  {c.local} -> {c.remote} {c.state}" for c in self.connections[:SHOWN_CONNECTIONS]
            )
        else:
            lines.append("no open TCP connection")
        return "\n".join(lines)


def _tree(rows: tuple[ProcessRow, ...]) -> list[tuple[int, ProcessRow]]:
    pids = {row.pid for row in rows}
    children: dict[int, list[ProcessRow]] = {}
    for row in rows:
        children.setdefault(row.ppid if row.ppid in pids else 0, []).append(row)
    ordered: list[tuple[int, ProcessRow]] = []

    def walk(parent: int, depth: int) -> None:
        for row in sorted(children.get(parent, []), key=lambda r: r.pid):
            ordered.append((depth, row))
            if row.pid != parent:
                walk(row.pid, depth + 1)

    walk(0, 0)
    return ordered


@runtime_checkable
class Inspect(Protocol):
    """A backend that can show what runs in a run's sandbox (optional): what a stalled
    turn's diagnosis says the harness was doing.

    Callers check for it with ``isinstance(sandbox, Inspect)``.
    """

    def processes(self, run_id: str) -> SandboxProcesses:
        """The run's processes now (the harness and its children, with state and CPU time)
        and their open TCP connections. Read-only; quick (one exec or one pass over
        ``/proc``). Raises the :class:`SandboxError` tree."""


@runtime_checkable
class Egress(Protocol):
    """A backend that can confine runs (network ``egress``) to an allowlist through an
    egress gateway, and reports what it refused (optional).

    Callers check for it with ``isinstance(sandbox, Egress)``; a backend without one has no
    gateway to read or reap.
    """

    def network_denials(
        self, run_id: str, since: float, until: float | None = None
    ) -> list[Denial]:
        """The connections of the run's sandbox the gateway refused between ``since`` and
        ``until`` (unix times), oldest first; empty unless the run is on the egress network.
        Raises the :class:`SandboxError` tree."""

    def reap_gateway(self) -> str | None:
        """The reaper's care of what confines the runs' networks: the gateway replaced when
        unhealthy or stopped, isolation rules put back when missing. What was done, or None.
        Raises the :class:`SandboxError` tree."""
