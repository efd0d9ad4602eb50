"""Where a backend's sandboxes live, as a name: the identity a run's later turns follow.

A run's container and workspace live with one Docker daemon, not with the machine a worker
happens to run on: two workers on one machine may talk to two daemons, and workers on many
machines may share one daemon. So the Docker backend is identified by its daemon's ID
(``docker info``), and the local backend, whose processes and workspaces are on the worker's
own machine, by the machine's hostname.
"""

from __future__ import annotations

import re
import socket

import docker.errors
import requests.exceptions
from docker.client import DockerClient, from_env

from sandbox.base import SandboxUnavailable

_UNSAFE = re.compile(r"[^A-Za-z0-9_.@:-]")


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
    return f"docker.{_UNSAFE.sub('-', daemon_id)}"


def local_location() -> str:
    """``local.<hostname>``: the local backend's processes live on this machine."""
    return f"local.{_UNSAFE.sub('-', socket.gethostname())}"
