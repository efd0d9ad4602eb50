"""Where a backend's sandboxes live, as a name: the identity a run's later turns follow.

A run's container and workspace live with one Docker daemon, not with the machine a worker
happens to run on: two workers on one machine may talk to two daemons, and workers on many
machines may share one daemon. So the Docker backend is identified by its daemon: the ``ID``
of ``docker info``, and a random mark the first worker leaves in the daemon (a labelled
volume, :data:`IDENTITY_VOLUME`). The ID alone is not enough: daemons of cloned machines,
or two daemons on one machine, report one ID when they share the key or the ``engine-id``
it comes from, and their workers would then take each other's runs. The local backend, whose
processes and workspaces are on the worker's own machine, is identified by its hostname.
"""

from __future__ import annotations

import contextlib
import re
import socket
import uuid
from typing import Any

import docker.errors
import requests.exceptions
from docker.client import DockerClient, from_env

from sandbox.base import SandboxUnavailable

_UNSAFE = re.compile(r"[^A-Za-z0-9_.@:-]")

IDENTITY_VOLUME = "harness-host-identity"
"""A volume that exists only to carry the daemon's mark (label :data:`IDENTITY_LABEL`); no
container mounts it. Removing it gives the daemon a new host queue: runs placed there before
could no longer be reached."""
IDENTITY_LABEL = "harness.host_identity"


def docker_location(base_url: str | None, timeout: float = 10.0) -> str:
    """``docker.<daemon ID>`` for the daemon at ``base_url`` (default: DOCKER_HOST or the
    local socket). Raises :class:`SandboxUnavailable` when it does not answer."""
    try:
        if base_url:
            client = DockerClient(base_url=base_url, version="auto", timeout=timeout)
        else:
            client = from_env(version="auto", timeout=timeout)
        try:
            daemon_id = str(client.info().get("ID") or "")
            mark = _identity_mark(client)
        finally:
            client.close()
    except (requests.exceptions.RequestException, docker.errors.DockerException, OSError) as exc:
        where = base_url or "DOCKER_HOST or the local socket"
        raise SandboxUnavailable(
            f"cannot ask the Docker daemon at {where} for its ID: {exc}",
            hint="start dockerd, point HARNESS_DOCKER_URL at it, or set HARNESS_HOST_QUEUE",
        ) from exc
    if not daemon_id:
        raise SandboxUnavailable("the Docker daemon reported no ID", hint="set HARNESS_HOST_QUEUE")
    return f"docker.{_UNSAFE.sub('-', daemon_id)}.{mark}"


def _identity_mark(client: Any) -> str:
    """The daemon's mark, made by the first worker to ask (a concurrent maker may win: the
    volume is read back, so every worker of the daemon reads the same mark)."""
    try:
        volume = client.volumes.get(IDENTITY_VOLUME)
    except docker.errors.NotFound:
        with contextlib.suppress(docker.errors.APIError):  # made meanwhile by another worker
            client.volumes.create(IDENTITY_VOLUME, labels={IDENTITY_LABEL: uuid.uuid4().hex[:12]})
        volume = client.volumes.get(IDENTITY_VOLUME)
    mark = str((volume.attrs.get("Labels") or {}).get(IDENTITY_LABEL) or "")
    if not re.fullmatch(r"[0-9a-f]{12}", mark):
        raise SandboxUnavailable(
            f"the volume {IDENTITY_VOLUME} of this Docker daemon carries no valid "
            f"{IDENTITY_LABEL} label",
            hint=f"remove it (docker volume rm {IDENTITY_VOLUME}) when no run lives there",
        )
    return mark


def local_location() -> str:
    """``local.<hostname>``: the local backend's processes live on this machine."""
    return f"local.{_UNSAFE.sub('-', socket.gethostname())}"
