"""The Docker backend's warm pool: started, unclaimed containers a run's first turn can claim.

A warm container is a run's container made for a pool run id (``pool-…``; real run ids never
start so) with the label of its shape: what must match for it to serve a run (image,
network, limits, user, read-only root). A run of that shape claims one instead of creating
and starting its own: its workspace directory is renamed to the run's (the atomic step that
decides when several workers race for the same one), and two claim files map the container
and the run to each other: ``<root>/claims/<container id>`` (the run) and
``<root>/claims/runs/<run id>`` (the container). Those files, not the container's name, are
how every worker on the host finds a claimed container: its labels, which cannot change,
still carry the pool run id, and its rename to the run's name (for ``docker ps``) comes with
the refill, ``REFILL_DELAY_S`` after the claim, once the run's first exec is under way. A
rename costs dockerd a write of the container's configuration under the container's lock,
which the run's first exec, right behind it, waited for: ~15 ms of a warm first turn here
(docs/performance.md, row 5).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from sandbox.base import (
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_SCOPE,
    Placement,
    RunSpec,
    SandboxError,
    SandboxGone,
)
from sandbox.docker.container import (
    NAME_PREFIX,
    container_name,
    docker_placement,
)
from sandbox.docker.execs import Seam
from sandbox.docker.raw_api import RawApi

log = logging.getLogger(__name__)

LABEL_POOL_SHAPE = "harness.pool_shape"
POOL_PREFIX = "pool-"
"""Run ids of warm containers not yet claimed by a run (real run ids never start so)."""
POOL_TTL_S = 3600.0
CLOSE_WAIT_S = 60.0
"""How long closing the pool waits for a warming under way (one container's create and
start, a second or so; the daemon's own timeout beyond that)."""
REFILL_DELAY_S = 1.0
"""How long after a claim the pool starts the next warm container: creating, starting and
probing one takes dockerd and the CPUs ~0.3 s, which slowed the claiming run's first exec
by a third on two vCPUs (docs/performance.md, row 5)."""


def pool_shape(spec: RunSpec) -> str:
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


class ContainerPool:
    """Keeps ``size`` warm containers per shape in ``scope``; 0 keeps none.

    ``create`` makes and starts a run's container (and its workspace), ``remove`` tears a
    run down; both are the sandbox's. ``api``: our own client of the daemon, if there is one
    (the list of warm containers a first turn makes goes over it).
    """

    def __init__(
        self,
        size: int,
        root: Path,
        scope: str,
        client: Callable[[], Any],
        seam: Seam,
        *,
        api: RawApi | None,
        create: Callable[[RunSpec], Placement],
        remove: Callable[[str], None],
    ) -> None:
        self.size = size
        self._root = root
        self._scope = scope
        self._client = client
        self._seam = seam
        self._api = api
        self._create = create
        self._remove = remove
        self._closed = threading.Event()
        self._warming = threading.Lock()

    def serves(self, spec: RunSpec) -> bool:
        """Whether runs like this one take (and leave the pool to refill) warm containers."""
        return self.size > 0 and not spec.workspace_key

    def warm(self, spec: RunSpec) -> int:
        """Start containers of ``spec``'s shape until ``size`` wait unclaimed; returns how
        many it started. ``spec.run_id`` is ignored.

        One caller at a time: callers that overlap (the worker's first warming, its reaper's
        refill, a refill after a claim) would each see the pool short and each fill it.
        """
        shape = pool_shape(spec)
        with self._warming:
            missing = self.size - len(self._waiting(shape))
            for _ in range(max(missing, 0)):
                if self._closed.is_set():
                    return 0
                labels = {
                    **spec.labels,
                    LABEL_POOL_SHAPE: shape,
                    LABEL_LEASE: f"{time.time() + POOL_TTL_S:.0f}",
                }
                run_id = POOL_PREFIX + uuid.uuid4().hex[:16]
                pooled = replace(spec, run_id=run_id, workspace_key=None, labels=labels)
                self._create(pooled)
                if self._closed.is_set():  # closed while this one was starting
                    self._remove(pooled.run_id)
                    return 0
            return max(missing, 0)

    def refill_later(self, spec: RunSpec, first: Callable[[], None] | None = None) -> None:
        """Warm containers of ``spec``'s shape ``REFILL_DELAY_S`` from now, on a timer thread
        (after ``first``, when given)."""

        def refill() -> None:
            if first is not None:
                first()
            try:
                self.warm(spec)
            except SandboxError as exc:
                log.warning("sandbox.pool_refill_failed", extra={"error": str(exc)})

        timer = threading.Timer(REFILL_DELAY_S, refill)
        timer.name, timer.daemon = "pool-refill", True
        timer.start()

    def close(self) -> None:
        """Stop warming and remove this scope's unclaimed warm containers: after a warming
        under way has finished the container it was making (it removes it, being closed),
        else the worker could exit with that one half made, and left running."""
        self._closed.set()
        waited = self._warming.acquire(timeout=CLOSE_WAIT_S)
        try:
            self._remove_unclaimed()
        finally:
            if waited:
                self._warming.release()

    def _remove_unclaimed(self) -> None:
        with self._seam("list the harness containers"):
            summaries = self._client().api.containers(
                all=True,
                filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_SCOPE}={self._scope}"]},
            )
        for summary in cast(list[dict[str, Any]], summaries):
            run_id = (summary.get("Labels") or {}).get(LABEL_RUN) or ""
            if run_id.startswith(POOL_PREFIX) and not self.claimed_run(str(summary.get("Id"))):
                self._remove(run_id)

    def claim(self, spec: RunSpec) -> Placement | None:
        """Take a warm container of the run's shape, if one waits. Several workers may race
        for the same one: moving its workspace directory is the atomic step that decides."""
        if not self.serves(spec):
            return None
        target = self._root / "run" / spec.run_id
        if not _clear_unused(target):
            return None  # a seeded workspace is the run's own: it gets its own container
        for summary in self._waiting(pool_shape(spec)):
            pool_run = (summary.get("Labels") or {}).get(LABEL_RUN, "")
            try:
                # Replaces the run's workspace when it is an empty directory (rename(2)).
                os.rename(self._root / "run" / pool_run, target)
            except OSError:
                continue  # another worker claimed it first
            container_id = str(summary["Id"])
            self._record_claim(container_id, spec.run_id)
            log.info(
                "sandbox.container_claimed",
                extra={"run_id": spec.run_id, "container": container_id},
            )
            self._after_claim(spec, container_id)
            return docker_placement(spec.run_id, container_id)
        return None

    def claimed_run(self, container_id: str) -> str | None:
        """The run that claimed this warm container, if one did."""
        return _read(self._claims / container_id)

    def claimed_container(self, run_id: str) -> str | None:
        """The warm container this run claimed, if it did (whether or not renamed yet)."""
        return _read(self._claims / "runs" / run_id)

    def release(self, container_id: str) -> None:
        """Forget the claim of a container being removed."""
        run_id = self.claimed_run(container_id)
        if run_id is not None and self.claimed_container(run_id) == container_id:
            (self._claims / "runs" / run_id).unlink(missing_ok=True)
        (self._claims / container_id).unlink(missing_ok=True)

    def _record_claim(self, container_id: str, run_id: str) -> None:
        """Both claim files, each written whole (a reader never sees half an id)."""
        (self._claims / "runs").mkdir(parents=True, exist_ok=True)
        for path, text in (
            (self._claims / container_id, run_id),
            (self._claims / "runs" / run_id, container_id),
        ):
            staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
            staging.write_text(text)
            os.replace(staging, path)

    def _after_claim(self, spec: RunSpec, container_id: str) -> None:
        """With the refill (:meth:`refill_later`): the container takes the run's name, then
        the pool refills."""

        def rename() -> None:
            try:
                with self._seam("rename a claimed container", run_id=spec.run_id):
                    self._client().api.rename(container_id, container_name(spec.run_id))
            except SandboxGone:
                pass  # the run ended before it: nothing is left to name
            except SandboxError as exc:  # the claim files still find it; the reaper sees it
                log.warning(
                    "sandbox.claimed_rename_failed",
                    extra={"run_id": spec.run_id, "container": container_id, "error": str(exc)},
                )

        self.refill_later(spec, first=rename)

    @property
    def _claims(self) -> Path:
        return self._root / "claims"

    def _waiting(self, shape: str) -> list[dict[str, Any]]:
        filters = {
            "label": [
                f"{LABEL_MANAGED}=true",
                f"{LABEL_SCOPE}={self._scope}",
                f"{LABEL_POOL_SHAPE}={shape}",
            ],
            "status": ["running"],
        }
        with self._seam("list the warm containers"):
            summaries = (
                self._api.containers(filters)
                if self._api
                else self._client().api.containers(filters=filters)
            )
        prefix = "/" + NAME_PREFIX + POOL_PREFIX
        return [
            s
            for s in cast(list[dict[str, Any]], summaries)
            if any(name.startswith(prefix) for name in s.get("Names") or [])
            and self.claimed_run(str(s.get("Id"))) is None  # claimed, not renamed yet
        ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _clear_unused(workspace: Path) -> bool:
    """Whether a warm workspace can take the place of the run's: true when the run's is
    missing (an unseeded run's baseline is recorded without making it), or holds nothing but
    an empty ``.home``, as a baseline taken by a walk leaves it (that ``.home`` is removed
    here, leaving an empty directory the claim's rename replaces). A workspace with anything
    else (a seeded repository or archive) stays, and the run creates its own container."""
    home = workspace / ".home"
    try:
        entries = [entry.name for entry in workspace.iterdir()]
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not entries:
        return True
    if entries != [".home"] or home.is_symlink() or not home.is_dir():
        return False
    try:
        home.rmdir()  # refused (ENOTEMPTY) when anything is in it
    except OSError:
        return False
    return True
