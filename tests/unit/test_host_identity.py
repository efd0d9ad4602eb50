"""Which host queues a worker serves, by default and with HARNESS_HOST_QUEUE."""

from __future__ import annotations

import socket

import pytest

from config import load_settings
from sandbox.base import SandboxUnavailable
from worker.fleet import host_queues

DOWN = "unix:///nonexistent/harness-docker.sock"


def test_a_local_worker_names_its_machine() -> None:
    settings = load_settings(key_prefix="hw", sandbox="local", allowed_sandboxes=())
    assert host_queues.host_queues(settings) == {"local": f"hw.host.local.{socket.gethostname()}"}


def test_the_override_names_one_queue_for_every_backend_served() -> None:
    settings = load_settings(
        key_prefix="hw", sandbox="local", allowed_sandboxes=("docker",), host_queue="hw.host.x"
    )
    assert host_queues.host_queues(settings) == {"docker": "hw.host.x", "local": "hw.host.x"}


def test_a_docker_worker_whose_daemon_does_not_answer_refuses_to_start() -> None:
    settings = load_settings(key_prefix="hw", sandbox="docker", docker_url=DOWN)
    with pytest.raises(SandboxUnavailable, match="HARNESS_HOST_QUEUE"):
        host_queues.host_queues(settings)


def test_a_daemon_merely_allowed_and_down_only_drops_its_queue() -> None:
    settings = load_settings(
        key_prefix="hw", sandbox="local", allowed_sandboxes=("docker",), docker_url=DOWN
    )
    assert list(host_queues.host_queues(settings)) == ["local"]
