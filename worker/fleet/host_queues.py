"""The host queues a worker serves: one per sandbox backend, naming where its sandboxes live
(the Docker daemon by its ID, this machine for the local sandbox), unless HARNESS_HOST_QUEUE
names one for all. Only a worker asks this (it talks to the Docker daemon)."""

from __future__ import annotations

import logging

from config import Settings
from sandbox.base import SandboxError
from sandbox.identity import docker_location, local_location

log = logging.getLogger(__name__)


def backends_served(settings: Settings) -> tuple[str, ...]:
    allowed = settings.allowed_sandboxes
    served = {settings.sandbox}
    for backend in ("docker", "local"):
        if backend in allowed or "*" in allowed:
            served.add(backend)
    return tuple(sorted(served))


def host_queues(settings: Settings) -> dict[str, str]:
    """For each sandbox backend this worker serves, the queue of the place its sandboxes live.

    ``HARNESS_HOST_QUEUE`` names one queue for all of them. Otherwise the Docker backend's
    queue names its daemon (by ID) and the local backend's this machine. A daemon that does
    not answer fails the worker's start when Docker is its default backend (it could place no
    run), and only drops Docker's queue when Docker is merely allowed.
    """
    backends = backends_served(settings)
    if settings.host_queue:
        return {backend: settings.host_queue for backend in backends}
    queues: dict[str, str] = {}
    for backend in backends:
        if backend == "local":
            where = local_location()
        else:
            try:
                where = docker_location(settings.docker_url)
            except SandboxError as exc:
                if settings.sandbox == "docker":
                    raise
                log.warning("host.docker_unavailable", extra={"error": str(exc)})
                continue
        queues[backend] = f"{settings.key_prefix}.host.{where}"
    return queues
