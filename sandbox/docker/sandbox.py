"""DockerSandbox: one container per run, one exec per turn, through the Docker SDK.

A run's container (``harness-run-<run_id>``) is created and hardened as
docker_container.py describes, or claimed from the warm pool (warm_pool.py), and kept alive
between turns. Its workspace is ``<root>/run/<run_id>`` or ``<root>/durable/<workspace_key>``
(workspace.py), bind-mounted at ``/workspace``.

Each turn is one ``exec`` whose stdout and stderr are streamed, separated, as the harness
writes them (docker_exec.py). Before the harness starts, whatever is left of the run's
earlier turns in the container is killed (container_scripts.py): a worker killed mid-turn
leaves its harness running there, its exec going on without a reader.

The lease: Docker labels cannot change after creation, so the lease given at creation is the
label ``harness.lease_until`` and every :meth:`renew` writes a lease file (workspace.py);
:meth:`managed` reports the later of the two.

A run's later turns do not ask the daemon for its container again: prepare() answers from
what this sandbox remembers (sandbox/docker/placements.py), and the turn's exec is the check; a
container that was removed or stopped meanwhile is then found, restarted or recreated as a
lookup would have, and the turn started there.

Secrets reach only the environment of the turn's exec. They are never in the container's
create arguments, labels, command, or our logs, so ``docker inspect`` does not show them.

Every Docker SDK and ``requests`` error is translated here, by :meth:`DockerSandbox._seam`
(which the modules above are handed), into the ``SandboxError`` tree:
:class:`SandboxUnavailable` (daemon unreachable), :class:`ImageMissing`, :class:`SandboxGone`
(the container was removed or stopped), :class:`StartFailed`.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, cast

import docker.errors
import requests.exceptions
from docker.client import DockerClient, from_env

from sandbox.base import (
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_SCOPE,
    LABEL_WORKER,
    Denial,
    ExecSpec,
    ImageMissing,
    ManagedSandbox,
    Placement,
    RunSpec,
    SandboxError,
    SandboxGone,
    SandboxProcesses,
    SandboxUnavailable,
    StartFailed,
)
from sandbox.docker.container import (
    BUILD_HINT,
    RunContainers,
    container_name,
    hardened,
    label_lease,
)
from sandbox.docker.execs import GONE_HINT, DockerProcess, ExecTransport
from sandbox.docker.gateway import Gateway
from sandbox.docker.isolation import BridgeGuard
from sandbox.docker.placements import KnownPlacements
from sandbox.docker.stream import DaemonRefused, RawEndpoint
from sandbox.docker.warm_pool import POOL_PREFIX, ContainerPool
from sandbox.network import BridgeConfig, EgressConfig
from sandbox.procs import parse_processes, processes_argv
from sandbox.store.snapshots import SnapshotStore
from sandbox.workspace import LeaseFiles, parse_user, safe_name, workspace_dir

log = logging.getLogger(__name__)

DENIAL_LOG_SETTLE_S = 0.3
"""How long after a turn the gateway's log is read for its denials (the gateway writes
them within ~0.1 s)."""
DAEMON_HINT = "start dockerd (scripts/ensure-docker) or point the worker at a running daemon"


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
        egress: EgressConfig | None = None,
        bridge: BridgeConfig | None = None,
    ) -> None:
        self.root = Path(root)
        self.scope = safe_name(scope, "scope")
        """Label value that separates deployments sharing one daemon (say, tests and a dev
        worker): :meth:`managed` lists only this scope's containers, so one deployment's
        reaper never removes another's."""
        self.base_url = base_url
        self.api_timeout = api_timeout
        url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._url = url
        tls = bool(os.environ.get("DOCKER_TLS_VERIFY")) and not base_url
        raw = None if tls else RawEndpoint.parse(url)
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._execs = ExecTransport(self._client, self._seam, raw, api_timeout)
        bridge = bridge or BridgeConfig()
        self.bridge = BridgeGuard(bridge, self._client, self._seam) if bridge.isolate else None
        """Network ``bridge``'s network of ours and its rules (None: Docker's default bridge,
        by the operator's choice)."""
        self._containers = RunContainers(
            self.root, self.scope, self._client, self._seam, self._execs, egress, self.bridge
        )
        self.egress = Gateway(egress, self._client, self._seam) if egress else None
        """The egress gateway of this daemon (network ``egress``), when configured."""
        self._pool = ContainerPool(
            warm_pool,
            self.root,
            self.scope,
            self._client,
            self._seam,
            api=self._execs.api,
            create=self._containers.create,
            remove=self.teardown,
        )
        self._leases = LeaseFiles(self.root)
        self._processes: dict[str, set[DockerProcess]] = {}
        self._placements = KnownPlacements()
        self._lock = threading.Lock()

    @property
    def warm_pool(self) -> int:
        """How many started, unclaimed containers to keep per shape (image, network, limits,
        user): a run's first turn claims one instead of creating and starting its own."""
        return self._pool.size

    # -- health ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise :class:`SandboxUnavailable` unless the daemon answers."""
        with self._seam("ping the daemon"):
            self._client().ping()

    def hardened(self, spec: RunSpec) -> dict[str, Any]:
        """The create arguments that harden every container of ours (``harness doctor``'s
        probe starts one like a run's)."""
        return hardened(spec)

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
            self._containers.make_workspace(spec)
            return known
        placement, new = self._prepare_checked(spec)
        self._placements.remember(spec, placement, new=new)
        return placement

    def _prepare_checked(self, spec: RunSpec) -> tuple[Placement, bool]:
        """Find (restarting it if stopped), claim from the pool, or create the run's
        container; and whether it was created just now."""
        if spec.network == "egress":
            return self._prepare_egress(spec)
        parse_user(spec.user)
        if spec.network == "bridge" and self.bridge is not None:
            self.bridge.ensure()  # before a container of the run (or the pool) joins it
        with self._seam("find the run's container", run_id=spec.run_id):
            existing = self._find(spec.run_id)
        if existing is not None:
            self._containers.make_workspace(spec)
            ours = self._pool.claimed_run(existing.id) == spec.run_id
            return self._containers.reuse(existing, spec, claimed=ours), False
        claimed = self._pool.claim(spec)
        if claimed is not None:  # the pool renames it with its refill, a second from now
            self._containers.make_workspace(spec)
            return claimed, False
        placement = self._containers.create(spec)
        if self._pool.serves(spec):  # the pool was empty (or is new): fill it for the next run
            self._pool.refill_later(spec)
        return placement, True

    def _prepare_egress(self, spec: RunSpec) -> tuple[Placement, bool]:
        """An egress run's container: the gateway first (started if missing), then the
        container (never from the warm pool: its labels carry the run's allowlist), then the
        gateway's configuration, before the run's first exec."""
        if self.egress is None:
            raise SandboxError(
                "network egress is not configured on this worker",
                hint="set HARNESS_EGRESS_* (docs/security.md) or use another network",
            )
        self.egress.ensure()
        with self._seam("find the run's container", run_id=spec.run_id):
            existing = self._containers.find(container_name(spec.run_id))
        new = existing is None
        if existing is not None:
            self._containers.make_workspace(spec)
            placement = self._containers.reuse(existing, spec)
        else:
            placement = self._containers.create(spec)
        self.egress.sync()
        return placement, new

    def reap_gateway(self) -> str | None:
        """The reaper's care of this daemon's egress gateway (:meth:`Gateway.reap`) and of
        network ``bridge``'s rules (:meth:`BridgeGuard.recheck`)."""
        done = []
        if self.egress is not None:
            done.append(self.egress.reap())
        if self.bridge is not None:
            done.append(self.bridge.recheck())
        return "; ".join(d for d in done if d) or None

    def network_denials(
        self, run_id: str, since: float, until: float | None = None
    ) -> list[Denial]:
        """The connections of the run's container that the egress gateway refused between
        ``since`` and ``until`` (unix times), oldest first; empty unless the run is on the
        egress network. Waits a moment for the gateway's log to catch up with ``until``."""
        if self.egress is None:
            return []
        address = self.egress.address_of(container_name(run_id))
        if address is None:
            return []
        settle = (until or time.time()) + DENIAL_LOG_SETTLE_S - time.time()
        if settle > 0:
            time.sleep(settle)
        return self.egress.denials(address, since, until)

    def start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> DockerProcess:
        if not spec.argv:
            raise StartFailed("empty command: nothing to start")
        unchecked = self._placements.take_unverified(placement.run_id)
        # A remembered placement handed out again is checked the long way below instead.
        new = self._placements.take_new(placement.run_id) and unchecked is None
        try:
            return self._start(placement, spec, secrets, new=new)
        except SandboxGone:
            if unchecked is None:
                raise
        # The remembered container is gone or stopped since the run's last turn: prepare the
        # run the long way, as a lookup would have, and start the turn there.
        self._placements.forget(placement.run_id)
        log.info("sandbox.container_changed", extra={"run_id": placement.run_id})
        fresh, new = self._prepare_checked(unchecked)
        self._placements.remember(unchecked, fresh)
        return self._start(fresh, spec, secrets, new=new)

    def _start(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str], *, new: bool
    ) -> DockerProcess:
        """The turn's exec; for a container created just now (``new``) also its check: one
        that stopped at once (its command died) is removed and the start fails. Its exec may
        have been created just before it died, and then fails otherwise than as gone: the
        container's state decides."""
        try:
            return self._exec(placement, spec, secrets)
        except SandboxError as exc:
            if not new or (not isinstance(exc, SandboxGone) and self._running(placement)):
                raise
            self._placements.forget(placement.run_id)
            with (
                suppress(docker.errors.NotFound),
                self._seam("remove the run's container", run_id=placement.run_id),
            ):
                self._client().containers.get(container_name(placement.run_id)).remove(force=True)
            raise StartFailed(
                f"cannot start the container of run {placement.run_id}: it stopped at once ({exc})",
                hint="check the image and the daemon log (docker logs, journalctl -u docker)",
            ) from exc

    def _running(self, placement: Placement) -> bool:
        """Whether the run's container is running (false when it is gone)."""
        with self._seam("inspect the run's container", run_id=placement.run_id):
            found = self._find(placement.run_id)
        return found is not None and found.status == "running"

    def _find(self, run_id: str) -> Any:
        """The run's container, or None: the warm container it claimed (found by its claim
        file whether or not it has the run's name yet), else the one of the run's name."""
        name = container_name(run_id)  # refuses a run id that is no name (nor file name)
        claimed = self._pool.claimed_container(run_id)
        if claimed is not None:
            found = self._containers.find(claimed)
            if found is not None:
                return found
        return self._containers.find(name)

    def _exec(
        self, placement: Placement, spec: ExecSpec, secrets: Mapping[str, str]
    ) -> DockerProcess:
        container = placement.container_id or container_name(placement.run_id)
        if spec.files:
            self._containers.write_files(container, spec.files, placement)
        process = self._execs.start(
            container,
            spec.cwd or placement.workspace,
            spec.argv,
            env={**spec.env, **secrets, "HOME": placement.home},
            stdin=spec.stdin,
            run_id=placement.run_id,
            keep_stdin=spec.keep_stdin,
        )
        with self._lock:
            running = self._processes.setdefault(placement.run_id, set())
            running.difference_update([p for p in running if p.eof])
            running.add(process)
        if process.strays:
            log.warning(
                "sandbox.strays_killed",
                extra={"run_id": placement.run_id, "container": container, "count": process.strays},
            )
        log.info(
            "sandbox.exec",
            extra={
                "run_id": placement.run_id,
                "container": container,
                "exec_id": process.exec_id,
                "executable": spec.argv[0],
            },
        )
        return process

    def renew(self, run_id: str, lease_until: float) -> None:
        self._leases.write(run_id, lease_until)

    def teardown(self, run_id: str, *, keep_workspace: bool = False) -> None:
        try:
            container_name(run_id)  # a run id no container can have: nothing of it exists
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
                container = self._find(run_id)
                if container is not None:
                    self._pool.release(container.id)
                    container.remove(force=True)
        except SandboxError as exc:
            log.warning(
                "sandbox.teardown_failed",
                extra={"run_id": run_id, "error": str(exc), "step": "remove container"},
            )
        self._leases.remove(run_id)
        SnapshotStore(self.root, run_id).remove()  # the run's record of its work goes with it
        if not keep_workspace:
            try:
                shutil.rmtree(workspace_dir(self.root, run_id))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning(
                    "sandbox.teardown_failed",
                    extra={"run_id": run_id, "error": str(exc), "step": "remove workspace"},
                )

    def processes(self, run_id: str) -> SandboxProcesses:
        """The container's processes (``ps``, which the harness images carry) and its TCP
        connections (``/proc/net``: the container's own network namespace), one exec."""
        with self._seam("find the run's container", run_id=run_id):
            container = self._find(run_id)
        if container is None:
            raise SandboxGone(f"the container of run {run_id} is gone")
        code, out, err = self._execs.run(
            container.id, processes_argv(), action="list the container's processes", run_id=run_id
        )
        listed = parse_processes(out.decode("utf-8", "replace"))
        if code != 0 and not listed.processes:  # an image without ps
            problem = err.decode("utf-8", "replace").strip()[:200] or f"exit code {code}"
            raise SandboxError(f"cannot list the container's processes: {problem}")
        return listed

    def diagnose(self, run_id: str) -> str | None:
        """Why the run's container cannot run turns: gone, OOM-killed, stopped, daemon down."""
        try:
            with self._seam("inspect the run's container", run_id=run_id):
                container = self._find(run_id)
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
        kills = self._containers.oom_kills(container.id, run_id)
        if kills:
            shown = f" of {limit // (1024 * 1024)} MiB" if limit else ""
            return (
                f"a process in the container was killed for exceeding its memory limit{shown} "
                f"({kills} out-of-memory kills so far)"
            )
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
                run_id = self._pool.claimed_run(str(summary.get("Id", ""))) or run_id
            leases = [label_lease(labels.get(LABEL_LEASE)), self._leases.read(run_id)]
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

    # -- the warm pool (sandbox.base.WarmPool) ----------------------------------------------

    def warm(self, spec: RunSpec) -> int:
        """Start containers of ``spec``'s shape until ``warm_pool`` wait unclaimed; returns how
        many it started. ``spec.run_id`` is ignored. Egress runs are never pooled."""
        if spec.network == "egress":
            return 0
        return self._pool.warm(spec)

    def close_pool(self) -> None:
        """Stop warming and remove this scope's unclaimed warm containers (worker shutdown)."""
        self._pool.close()

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
        except DaemonRefused as exc:
            raise _refused(action, run_id, exc.status, exc.message) from exc
        except docker.errors.NotFound as exc:
            raise _refused(action, run_id, 404, str(exc.explanation)) from exc
        except docker.errors.APIError as exc:
            raise _refused(action, run_id, exc.status_code, str(exc.explanation or exc)) from exc
        except (
            requests.exceptions.RequestException,
            docker.errors.DockerException,
            http.client.HTTPException,
            OSError,
        ) as exc:
            raise self._unavailable(action, exc) from exc


def _refused(action: str, run_id: str | None, status: int | None, explanation: str) -> SandboxError:
    """An error status of the daemon's, whichever client heard it (the SDK or ours)."""
    if status == 404:
        return SandboxGone(
            f"cannot {action}: the container of run {run_id or '?'} is gone ({explanation})",
            hint=GONE_HINT,
        )
    if status == 409 and "not running" in explanation:
        return SandboxGone(
            f"cannot {action}: the container of run {run_id or '?'} is not running",
            hint=GONE_HINT,
        )
    return SandboxError(
        f"Docker refused to {action}: {explanation}", hint="see the daemon log for details"
    )
