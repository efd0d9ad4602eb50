"""What a run's container is: its name, its labels, its hardened create arguments, its files.

Hardening, from the :class:`~sandbox.base.RunSpec`: a non-root numeric user, every capability
dropped, ``no-new-privileges``, a read-only root with a tmpfs ``/tmp`` owned by that user,
pids, memory (swap included) and CPU limits, and the network policy (``none``; ``bridge``:
a network of ours that keeps runs from each other, the host and private addresses, see
:mod:`sandbox.docker.isolation`; ``host``; or ``egress``: only the egress network, whose
gateway allows the run's allowlist, see :mod:`sandbox.docker.egress`). Never privileged;
the only host path in the container is the run's workspace, bind-mounted at ``/workspace``
and owned by the container user; HOME is ``/workspace/.home``.
The container is kept alive between turns by ``sleep infinity`` under Docker's init
(``init=True``, which also reaps orphaned harness children).

A container that does not start fails here, as StartFailed, with the container and a new
workspace removed again. A started one is checked by the run's first exec, whose wrapper
(:mod:`sandbox.docker.scripts`) fails as StartFailed, saying why, when the container has no
/bin/sh or its user cannot write the workspace or HOME: no exec of its own before the first
turn (it cost a new container ~45 ms here). An image may name a skeleton HOME in its label
``harness.home_skeleton`` (the CLI image pre-seeds OpenCode's provider package there, so it
runs offline): a fresh HOME is filled from it.
"""

from __future__ import annotations

import io
import logging
import posixpath
import shutil
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from docker.types import Mount

from sandbox.base import (
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_SCOPE,
    LABEL_WORKSPACE_KEY,
    ImageMissing,
    Placement,
    RunSpec,
    SandboxError,
    SandboxUnavailable,
    StartFailed,
)
from sandbox.docker.egress import proxy_environment
from sandbox.docker.execs import ExecTransport, Seam
from sandbox.docker.isolation import BridgeGuard
from sandbox.docker.scripts import memory_events_argv, oom_kill_count
from sandbox.network import EgressConfig
from sandbox.workspace import make_owned_workspace, parse_user, safe_name

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
HOME = "/workspace/.home"
NAME_PREFIX = "harness-run-"
LABEL_HOME_SKELETON = "harness.home_skeleton"
"""An image label naming a directory whose contents fill a fresh HOME."""
BUILD_HINT = "run scripts/build-images to build the harness images on this host"


def container_name(run_id: str) -> str:
    return NAME_PREFIX + safe_name(run_id, "run id")


RESERVED_NAME_WAIT_S = 10.0
"""How long a create refused a container's name (409: another create has it) waits for that
container to be found by the name."""


def made_by_another(find: Callable[[], Any]) -> Any:
    """The container another create is making, by ``find`` (a lookup by its name, None while
    there is none): dockerd reserves the name, and refuses ours with a 409, a moment before
    a lookup by that name finds it (a 404 meanwhile; 30 of 30 such races here). None when it
    is still not found after :data:`RESERVED_NAME_WAIT_S` (that create failed)."""
    deadline = time.monotonic() + RESERVED_NAME_WAIT_S
    while True:
        found = find()
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def docker_placement(run_id: str, container_id: str) -> Placement:
    return Placement("docker", run_id, WORKSPACE, HOME, container_id=container_id)


def create_args(
    spec: RunSpec,
    workspace: Path,
    scope: str,
    egress: EgressConfig | None = None,
    bridge: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``containers.create`` for the run's container. ``bridge``:
    the Docker network of network ``bridge``'s runs (:mod:`sandbox.docker.isolation`; None:
    Docker's default bridge)."""
    labels = {
        **{str(k): str(v) for k, v in spec.labels.items()},
        LABEL_MANAGED: "true",
        LABEL_RUN: spec.run_id,
        LABEL_SCOPE: scope,
    }
    if spec.workspace_key:
        labels[LABEL_WORKSPACE_KEY] = spec.workspace_key
    args = {
        "image": spec.image,
        "command": ["sleep", "infinity"],
        "name": container_name(spec.run_id),
        "labels": labels,
        "working_dir": WORKSPACE,
        "environment": {"HOME": HOME, "TMPDIR": "/tmp"},
        "mounts": [Mount(target=WORKSPACE, source=str(workspace), type="bind")],
        **hardened(spec),
    }
    if spec.network == "bridge" and bridge:
        args["network_mode"] = bridge
    if spec.network == "egress":
        if egress is None:
            raise SandboxError(
                "network egress needs the egress gateway, which this sandbox is not given",
                hint="configure HARNESS_EGRESS_* on the worker (docs/security.md)",
            )
        # Only the egress network; the gateway is its route out and its resolver (which
        # answers no name: the proxy resolves them). The proxy variables are not secret.
        args["network_mode"] = egress.network_name
        args["dns"] = [egress.router_ip]
        args["environment"] = {**args["environment"], **proxy_environment(egress)}
    return args


def hardened(spec: RunSpec) -> dict[str, Any]:
    """How every container of ours runs (a run's, and the doctor's probe): the run's user, no
    capabilities, no new privileges, a read-only root with a /tmp the user owns, the run's
    limits and network, an init, a private cgroup namespace."""
    uid, gid = parse_user(spec.user)
    args: dict[str, Any] = {
        "init": True,
        "user": spec.user,
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
    }
    if spec.read_only_root:
        # Docker here ignores mode=1777 on a tmpfs; owning it is what lets the user write.
        args["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,uid={uid},gid={gid}"}
    return args


def files_archive(files: Mapping[str, str], workspace: str) -> bytes:
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


def label_lease(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


class RunContainers:
    """Finds, restarts and creates runs' containers (their workspaces under ``root``), and
    runs the helper commands a container needs: its HOME skeleton, a turn's
    files, its out-of-memory count."""

    def __init__(
        self,
        root: Path,
        scope: str,
        client: Callable[[], Any],
        seam: Seam,
        execs: ExecTransport,
        egress: EgressConfig | None = None,
        bridge: BridgeGuard | None = None,
    ) -> None:
        self._egress = egress
        self._bridge = bridge
        self._root = root
        self._scope = scope
        self._client = client
        self._seam = seam
        self._execs = execs

    def find(self, name: str) -> Any:
        """The container of that name (or id), or None; Docker errors are left to the
        caller's seam. Inspected over our own connection where there is one (the SDK's
        model made from what it returned), a millisecond of CPU less than the SDK's."""
        api = self._execs.api
        if api is None:
            try:
                return self._client().containers.get(name)
            except docker.errors.NotFound:
                return None
        attrs = api.container_inspect(name)
        return None if attrs is None else self._client().containers.prepare_model(attrs)

    def reuse(self, container: Any, spec: RunSpec, *, claimed: bool = False) -> Placement:
        """The run's existing container, restarted if it stopped. ``claimed``: a warm
        container the run claimed (its labels carry the pool's run id, not the run's)."""
        labels = container.labels or {}
        owner = spec.run_id if claimed else labels.get(LABEL_RUN)
        if owner != spec.run_id or labels.get(LABEL_MANAGED) != "true":
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
        return docker_placement(spec.run_id, container.id)

    def write_files(self, container: str, files: Mapping[str, str], placement: Placement) -> None:
        """Write a turn's files (absolute paths under the workspace) as the container user."""
        code, _, err = self._execs.run(
            container,
            ["tar", "-x", "-f", "-", "-C", "/"],
            stdin=files_archive(files, placement.workspace),
            action="write the turn's files",
            run_id=placement.run_id,
        )
        if code != 0:
            raise StartFailed(
                f"cannot write the turn's files ({', '.join(sorted(files))}): "
                f"{err.decode('utf-8', 'replace').strip()}"
            )

    def make_workspace(self, spec: RunSpec) -> tuple[Path, bool, bool]:
        uid, gid = parse_user(spec.user)
        return make_owned_workspace(self._root, spec.run_id, spec.workspace_key, uid, gid)

    def create(self, spec: RunSpec) -> Placement:
        """Create and start the run's container (and its workspace)."""
        name = container_name(spec.run_id)
        assert spec.image is not None
        parse_user(spec.user)
        client = self._client()
        with self._seam("look up the run's image", image=spec.image):
            try:
                image = client.images.get(spec.image)
            except docker.errors.ImageNotFound:
                raise ImageMissing(
                    f"image {spec.image} is not on this Docker host", hint=BUILD_HINT
                ) from None
        bridge = None
        if spec.network == "bridge" and self._bridge is not None:
            self._bridge.ensure()
            bridge = self._bridge.network_name
        workspace, created_workspace, fresh_home = self.make_workspace(spec)
        container: Any = None
        try:
            with self._seam("create the run's container", run_id=spec.run_id, image=spec.image):
                try:
                    container = client.containers.create(
                        **create_args(spec, workspace, self._scope, self._egress, bridge)
                    )
                except docker.errors.NotFound:
                    if bridge is None or self._bridge is None:
                        raise
                    # The network was removed since this process made or found it.
                    self._bridge.forget()
                    self._bridge.ensure()
                    container = client.containers.create(
                        **create_args(spec, workspace, self._scope, self._egress, bridge)
                    )
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        raise
                    # Another worker thread created it in the meantime: use that one.
                    found = made_by_another(lambda: self.find(name))
                    if found is None:
                        raise
                    return self.reuse(found, spec)
                container.start()
            skeleton = (image.labels or {}).get(LABEL_HOME_SKELETON)
            if skeleton and fresh_home:
                self._copy_skeleton(container.id, skeleton)
        except BaseException as exc:
            self._undo(container, workspace if created_workspace else None)
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
        return docker_placement(spec.run_id, container.id)

    def oom_kills(self, container: str, run_id: str) -> int:
        """The container's out-of-memory kill count (cgroup v1 or v2), 0 when unknown.

        An exec'd process killed by the OOM killer leaves the container running and
        ``State.OOMKilled`` false; only the memory cgroup remembers it.
        """
        try:
            _code, out, _ = self._execs.run(
                container, memory_events_argv(), action="read the memory cgroup", run_id=run_id
            )
        except SandboxError:
            return 0
        return oom_kill_count(out)

    def _copy_skeleton(self, container: str, skeleton: str) -> None:
        code, _, err = self._execs.run(
            container,
            ["cp", "-R", "-p", "--", skeleton.rstrip("/") + "/.", HOME + "/"],
            action="fill HOME from the image's skeleton",
        )
        if code != 0:
            raise StartFailed(
                f"cannot copy the image's HOME skeleton {skeleton}: "
                f"{err.decode('utf-8', 'replace').strip()}"
            )

    @staticmethod
    def _undo(container: Any, workspace: Path | None) -> None:
        if container is not None:
            try:
                container.remove(force=True)
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.warning(
                    "sandbox.cleanup_failed", extra={"container": container.id, "error": str(exc)}
                )
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
