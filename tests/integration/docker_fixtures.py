"""Docker fixtures: a reachable daemon, images built by scripts/build-images, sandboxes that
clean up after themselves.

Tests that use them skip when Docker is unreachable, except under ``CI=true``, where a
missing daemon is a failure. Import the fixtures into a conftest (or a test module) by name.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from sandbox.base import Placement, RunSpec
from sandbox.docker.sandbox import DockerSandbox

REPO = Path(__file__).resolve().parents[2]
IMAGES = {
    "demo": "harness-worker/demo:1",
    "clis": "harness-worker/clis:1",
    "gateway": "harness-worker/gateway:1",
}


def docker_problem() -> str | None:
    """Why Docker cannot be used here, or None when the daemon answers."""
    try:
        import docker
    except ImportError:
        return "the docker Python package is not installed"
    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable daemon"
        return f"Docker is unreachable ({exc}); run scripts/ensure-docker"
    return None


def require_docker() -> None:
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs Docker: {problem}")
    pytest.skip(problem)


def ensure_images(names: Iterable[str]) -> dict[str, str]:
    """Build (or reuse) the named images with scripts/build-images; returns name -> tag."""
    built = {}
    for name in names:
        result = subprocess.run(
            [str(REPO / "scripts" / "build-images"), "--only", name],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if result.returncode != 0:
            pytest.fail(f"scripts/build-images --only {name} failed:\n{result.stderr[-3000:]}")
        built[name] = IMAGES[name]
    return built


@pytest.fixture(scope="session")
def docker_daemon() -> None:
    require_docker()


@pytest.fixture(scope="session")
def demo_image(docker_daemon: None) -> str:
    return ensure_images(["demo"])["demo"]


@pytest.fixture(scope="session")
def clis_image(docker_daemon: None) -> str:
    return ensure_images(["clis"])["clis"]


@pytest.fixture
def docker_sandbox(tmp_path: Path, docker_daemon: None) -> Iterator[DockerSandbox]:
    """A DockerSandbox in its own scope (so no other deployment's reaper sees its
    containers); every container it made is removed afterwards."""
    sandbox = DockerSandbox(tmp_path / "sandbox", scope=f"test-{uuid.uuid4().hex[:12]}")
    yield sandbox
    for found in sandbox.managed():
        sandbox.teardown(found.run_id)


@pytest.fixture
def docker_run(
    docker_sandbox: DockerSandbox, demo_image: str
) -> Callable[..., tuple[Placement, RunSpec]]:
    """Prepares a run of the demo image: ``docker_run(**RunSpec overrides)``."""

    def make(**overrides: object) -> tuple[Placement, RunSpec]:
        fields: dict[str, object] = {
            "run_id": f"t{uuid.uuid4().hex[:12]}",
            "image": demo_image,
            "labels": {"harness.worker": "test-worker", "harness.lease_until": "1700000000"},
        }
        fields.update(overrides)
        spec = RunSpec(**fields)  # type: ignore[arg-type]
        return docker_sandbox.prepare(spec), spec

    return make
