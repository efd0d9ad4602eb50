"""A warm pool: a new run's first turn takes a started container instead of creating one."""

from __future__ import annotations

import time

import docker
import pytest

from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]


def pooled(env: Env) -> list[docker.models.containers.Container]:
    return [
        c
        for c in docker.from_env().containers.list(
            filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]}
        )
        if c.name.startswith("harness-run-pool-")
    ]


def wait_for_pool(env: Env, size: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(pooled(env)) < size and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pooled(env)) == size


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
    assert docker.from_env().containers.get(warm.id).name == f"harness-run-{run_id}"
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
