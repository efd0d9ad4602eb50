"""Where a backend's sandboxes live, as a name: the identity a run's later turns follow.

A run's container and workspace live with one Docker daemon, not with the machine a worker
happens to run on: two workers on one machine may talk to two daemons, and workers on many
machines may share one daemon. So the Docker backend is identified by its daemon: the ``ID``
of ``docker info``, and a random mark the first worker leaves in the daemon (a labelled
volume, :data:`IDENTITY_VOLUME`). The ID alone is not enough: daemons of cloned machines,
or two daemons on one machine, report one ID when they share the key or the ``engine-id``
it comes from, and their workers would then take each other's runs. The local backend, whose
processes and workspaces are on the worker's own machine, is identified by its hostname.

A name is kept short: a run record (a Redis hash) holds its host queue, and Redis keeps a
hash compact (a listpack) only while every value is at most ``hash-max-listpack-value``
(64 bytes by default); a longer one doubles what every idle run costs. So the Docker name
carries the mark (what tells daemons apart) and only the head of the daemon ID (for an
operator reading queue names), and a long hostname is cut and given a digest. The names
before that (:attr:`Location.legacy`) are still consumed, for runs placed before.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import uuid
from dataclasses import dataclass
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


DAEMON_ID_CHARS = 8
"""How much of the daemon ID a Docker name keeps: enough for an operator to tell daemons
apart at a glance; the mark is what tells them apart for the worker."""
HOSTNAME_CHARS = 24
"""The longest hostname a local name carries whole; a longer one is cut and given a digest."""


@dataclass(frozen=True)
class Location:
    """Where a backend's sandboxes live, as the tail of a host queue's name."""

    name: str
    legacy: str
    """The same place as named before names were shortened (the full daemon ID, the whole
    hostname): run records written then still name it. Equal to ``name`` where the two
    forms agree (a short hostname)."""


def docker_name(daemon_id: str, mark: str) -> str:
    """``docker.<the daemon ID's first 8 characters>.<mark>``."""
    return f"docker.{_UNSAFE.sub('-', daemon_id)[:DAEMON_ID_CHARS]}.{mark}"


def legacy_docker_name(daemon_id: str, mark: str) -> str:
    """``docker.<daemon ID>.<mark>``, the name before the rename: 56 bytes with the UUID of
    Docker 28, 79 with the older colon-separated ID, so over 64 with any queue prefix."""
    return f"docker.{_UNSAFE.sub('-', daemon_id)}.{mark}"


def local_name(hostname: str) -> str:
    """``local.<hostname>``; a hostname longer than :data:`HOSTNAME_CHARS` keeps its head
    and gets a digest of the whole one, so two long names with one head still differ."""
    safe = _UNSAFE.sub("-", hostname)
    if len(safe) <= HOSTNAME_CHARS:
        return f"local.{safe}"
    digest = hashlib.sha256(hostname.encode()).hexdigest()[:8]
    return f"local.{safe[: HOSTNAME_CHARS - len(digest) - 1]}-{digest}"


def legacy_local_name(hostname: str) -> str:
    """``local.<hostname>`` whatever its length, the name before the rename."""
    return f"local.{_UNSAFE.sub('-', hostname)}"


def locate_docker(base_url: str | None, timeout: float = 10.0) -> Location:
    """The daemon at ``base_url`` (default: DOCKER_HOST or the local socket), by its ID and
    mark. Raises :class:`SandboxUnavailable` when it does not answer."""
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
    return Location(docker_name(daemon_id, mark), legacy_docker_name(daemon_id, mark))


def docker_location(base_url: str | None, timeout: float = 10.0) -> str:
    """The name of :func:`locate_docker`."""
    return locate_docker(base_url, timeout).name


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


def locate_local() -> Location:
    """This machine, by its hostname: the local backend's processes live here."""
    hostname = socket.gethostname()
    return Location(local_name(hostname), legacy_local_name(hostname))
