"""A warm pool: a new run's first turn takes a started container instead of creating one."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandbox.base import ExecSpec, RunSpec
from sandbox.docker.sandbox import DockerSandbox
from tests.integration import docker_fixtures
from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.docker]
docker_daemon = docker_fixtures.docker_daemon
demo_image = docker_fixtures.demo_image


def pooled(env: Env) -> list[docker.models.containers.Container]:
    return [
        c
        for c in docker.from_env().containers.list(
            filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]}
        )
        if c.name.startswith("harness-run-pool-")
    ]


def wait_for_name(container_id: str, name: str, timeout: float = 30) -> None:
    """The claimed container takes the run's name after the claiming turn, with the refill."""
    deadline = time.monotonic() + timeout
    while docker.from_env().containers.get(container_id).name != name:
        assert time.monotonic() < deadline, f"{container_id[:12]} not named {name}"
        time.sleep(0.1)


def wait_for_pool(env: Env, size: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(pooled(env)) < size and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pooled(env)) == size


@pytest.mark.redis
@pytest.mark.celery
def test_first_turn_claims_a_warm_container_and_the_pool_refills(
    env: Env, workers: list[WorkerProcess]
) -> None:
    require_docker()
    ensure_images(["demo"])
    env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_ALLOWED_EXECUTABLES="harness-demo",
        HARNESS_WARM_POOL="1",
        HARNESS_IMAGES="claude-code=harness-worker/demo:1,codex=harness-worker/demo:1,gemini=harness-worker/demo:1,opencode=harness-worker/demo:1,pi=harness-worker/demo:1",
    )
    workers.append(start_worker(env))
    wait_for_pool(env, 1)
    (warm,) = pooled(env)
    client = env.client()
    run_id = client.start_run("stdio-json", "@run touch /workspace/mine", executable="harness-demo")
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    assert client.status(run_id)["container_id"] == warm.id  # the warm one, now the run's
    wait_for_name(warm.id, f"harness-run-{run_id}")
    assert (env.tmp / "workspaces" / "docker" / "run" / run_id / "mine").exists()
    wait_for_pool(env, 1)  # refilled for the next run
    assert pooled(env)[0].id != warm.id
    client.end(run_id)
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(warm.id)
    # A run shaped differently (its own memory limit) does not take the warm container.
    other = client.start_run("stdio-json", "hi", executable="harness-demo", memory="256m")
    client.wait(other, 1, timeout=60)
    assert client.status(other)["container_id"] != pooled(env)[0].id
    client.end(other)


@pytest.mark.redis
@pytest.mark.celery
def test_stopping_the_worker_removes_its_unclaimed_warm_containers_and_a_successor_warms_at_once(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """The worker that stopped holds the host's reaper lock for an interval (60 s by default):
    its successor (a restart, a rolling deploy) warms its pool as it starts all the same."""
    require_docker()
    ensure_images(["demo"])
    env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_WARM_POOL="2",
        HARNESS_IMAGES="stdio-json=harness-worker/demo:1",
    )
    worker = start_worker(env)
    workers.append(worker)
    wait_for_pool(env, 2)
    assert worker.stop() == 0
    assert pooled(env) == []
    workers.append(start_worker(env))
    wait_for_pool(env, 2, timeout=20)  # not at the next pass, 60 s later


@pytest.fixture
def two_workers(
    tmp_path: Path, docker_daemon: None
) -> Iterator[tuple[DockerSandbox, DockerSandbox]]:
    """Two workers of one host: one workspace root, one scope, a warm pool each."""
    scope = f"test-{uuid.uuid4().hex[:12]}"
    first, second = (DockerSandbox(tmp_path / "root", scope=scope, warm_pool=1) for _ in "ab")
    yield first, second
    for sandbox in (first, second):
        sandbox.close_pool()
    for found in first.managed():
        first.teardown(found.run_id)


def test_a_claimed_container_serves_the_runs_later_turns_from_any_worker_of_the_host(
    two_workers: tuple[DockerSandbox, DockerSandbox], demo_image: str
) -> None:
    """The claim files, not the container's name, find a claimed container: another worker
    (or this one restarted) takes the run's next turn there, before the rename and after
    it, and tears it down with its claim."""
    first, second = two_workers
    spec = RunSpec(run_id=f"t{uuid.uuid4().hex[:12]}", image=demo_image, network="none")
    assert first.warm(spec) == 1
    claimed = first.prepare(spec)
    client = docker.from_env()
    assert client.containers.get(claimed.container_id).name.startswith("harness-run-pool-")
    assert second.prepare(spec) == claimed  # before the rename: found by its claim file
    assert [m.run_id for m in second.managed()].count(spec.run_id) == 1

    wait_for_name(str(claimed.container_id), f"harness-run-{spec.run_id}")
    restarted = DockerSandbox(first.root, scope=first.scope)
    assert restarted.prepare(spec) == claimed  # after it, from a worker that knows nothing
    process = restarted.start(claimed, ExecSpec(argv=("harness-demo",), stdin=b"@complete ok"), {})
    while not process.eof:
        process.read(0.5)
    assert process.wait(10) == 0
    process.close()

    second.teardown(spec.run_id)
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(claimed.container_id)
    assert not list((first.root / "claims").glob(f"**/{spec.run_id}"))
    assert not (first.root / "claims" / str(claimed.container_id)).exists()
