"""The host queues a worker serves: one per sandbox backend, naming where its sandboxes live
(the Docker daemon by its ID and mark, this machine for the local sandbox), unless
HARNESS_HOST_QUEUE names one for all. Only a worker asks this (it talks to the Docker daemon).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from config import Settings
from sandbox.base import SandboxError
from sandbox.identity import Location, locate_docker, locate_local

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostQueues:
    by_backend: dict[str, str] = field(default_factory=dict)
    """The queue of each backend served: what a run placed here records."""
    legacy: dict[str, str] = field(default_factory=dict)
    """The queue each backend had before host queue names were shortened (sandbox/identity.py),
    where it differs: records of runs placed before still name it, so it is consumed too (a
    turn there rewrites the record to the new one)."""

    def consumed(self) -> list[str]:
        return sorted(set(self.by_backend.values()) | set(self.legacy.values()))


def backends_served(settings: Settings) -> tuple[str, ...]:
    allowed = settings.allowed_sandboxes
    served = {settings.sandbox}
    for backend in ("docker", "local"):
        if backend in allowed or "*" in allowed:
            served.add(backend)
    return tuple(sorted(served))


def host_queues(settings: Settings) -> HostQueues:
    """For each sandbox backend this worker serves, the queue of the place its sandboxes live.

    ``HARNESS_HOST_QUEUE`` names one queue for all of them (and no legacy one). Otherwise the
    Docker backend's queue names its daemon and the local backend's this machine. A daemon
    that does not answer fails the worker's start when Docker is its default backend (it
    could place no run), and only drops Docker's queue when Docker is merely allowed.
    """
    backends = backends_served(settings)
    if settings.host_queue:
        return HostQueues({backend: settings.host_queue for backend in backends})
    by_backend: dict[str, str] = {}
    legacy: dict[str, str] = {}
    for backend in backends:
        where: Location
        if backend == "local":
            where = locate_local()
        else:
            try:
                where = locate_docker(settings.docker_url)
            except SandboxError as exc:
                if settings.sandbox == "docker":
                    raise
                log.warning("host.docker_unavailable", extra={"error": str(exc)})
                continue
        by_backend[backend] = f"{settings.key_prefix}.host.{where.name}"
        if where.legacy != where.name:
            legacy[backend] = f"{settings.key_prefix}.host.{where.legacy}"
    return HostQueues(by_backend, legacy)
