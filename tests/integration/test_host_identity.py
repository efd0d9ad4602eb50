"""A host queue names the Docker daemon a run's container lives on, not the machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.fleet import hosts

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _daemon_id(url: str | None) -> str:
    client = docker.DockerClient(base_url=url) if url else docker.from_env()
    try:
        return str(client.info()["ID"])
    finally:
        client.close()


def _mark() -> str:
    """The mark the first worker left in the local daemon (sandbox/identity.py)."""
    client = docker.from_env()
    try:
        return str(
            client.volumes.get("harness-host-identity").attrs["Labels"]["harness.host_identity"]
        )
    finally:
        client.close()


def test_two_daemons_on_one_machine_never_share_a_host_queue(
    env: Env, workers: list[WorkerProcess]
) -> None:
    require_docker()
    demo_image = ensure_images(["demo"])["demo"]
    second = subprocess.run(
        [str(REPO / "scripts" / "second-dockerd"), demo_image],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout.strip()
    env.vars.update(
        {"HARNESS_SANDBOX": "docker", "HARNESS_NETWORK": "none", "HARNESS_METRICS_PORT": "0"}
    )
    # Only the first takes first turns, so the run's container is on the local daemon; the
    # second, on the same machine, talks to the second daemon. No HARNESS_HOST_QUEUE anywhere.
    local = start_worker(env)
    other = start_worker(env, HARNESS_DOCKER_URL=second, HARNESS_HARNESS_QUEUES="codex")
    workers += [local, other]
    client = env.client()
    run_id = client.start_run(
        "stdio-json", "first", executable="harness-demo", sandbox="docker", network="none"
    )
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    record = client.status(run_id)
    assert record["queue"].startswith(f"{env.prefix}.host.docker.{_daemon_id(None)[:8]}.")
    # The other worker serves its own daemon's queue, even where the two daemons report one
    # ID (as they do here when the second shares /etc/docker/key.json): the mark each
    # daemon carries tells them apart.
    other_queues = env.redis().get(
        env.keys.worker_alive(f"{socket.gethostname()}:{other.proc.pid}")
    )
    head = f"{env.prefix}.host.docker.{_daemon_id(second)[:8]}."
    [other_host_queue] = [q for q in other_queues.split(",") if q.startswith(head)]
    assert other_host_queue != record["queue"]
    container = record["container_id"]
    for turn in range(2, 6):
        assert client.submit_turn(run_id, f"turn {turn}") == turn
        assert client.wait(run_id, turn, timeout=60).type == "turn-complete"
        assert client.status(run_id)["container_id"] == container
    assert "Task harness.run_turn" not in other.logs()
    client.end(run_id, timeout=60)
    remote = docker.DockerClient(base_url=second)
    try:
        assert (
            remote.containers.list(all=True, filters={"label": f"harness.scope={env.prefix}"}) == []
        )
    finally:
        remote.close()


def test_a_run_placed_under_its_hosts_legacy_queue_name_still_gets_its_turns_and_end(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """A run placed before host queue names were shortened names the daemon by its whole ID:
    the daemon's workers consume that name too, and a turn taken there moves the record to
    the new name."""
    require_docker()
    ensure_images(["demo"])
    env.vars.update(
        {"HARNESS_SANDBOX": "docker", "HARNESS_NETWORK": "none", "HARNESS_METRICS_PORT": "0"}
    )
    worker = start_worker(env)
    workers.append(worker)
    client, r = env.client(), env.redis()
    run_id = client.start_run(
        "stdio-json", "first", executable="harness-demo", sandbox="docker", network="none"
    )
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    daemon_id, mark, record = _daemon_id(None), _mark(), client.status(run_id)
    queue, container = record["queue"], record["container_id"]
    assert queue == f"{env.prefix}.host.docker.{daemon_id[:8]}.{mark}"
    assert len(queue.encode()) <= 64
    assert r.object("encoding", env.keys.run(run_id)) == "listpack"
    legacy = f"{env.prefix}.host.docker.{daemon_id}.{mark}"
    assert legacy in r.get(env.keys.worker_alive(f"{socket.gethostname()}:{worker.proc.pid}"))
    assert hosts.alive(r, env.keys, legacy)

    r.hset(env.keys.run(run_id), "queue", legacy)  # as the worker before the rename left it
    assert client.submit_turn(run_id, "second") == 2
    assert client.wait(run_id, 2, timeout=60).type == "turn-complete"
    record = client.status(run_id)
    assert (record["queue"], record["container_id"]) == (queue, container)
    # (Its record stays a hash table: Redis never converts one back to a listpack.)

    r.hset(env.keys.run(run_id), "queue", legacy)
    client.end(run_id, timeout=60)
    assert not client.status(run_id).get("last_error")  # the worker tore it down, in time
    docker_client = docker.from_env()
    try:
        scope = f"harness.scope={env.prefix}"
        assert docker_client.containers.list(all=True, filters={"label": scope}) == []
    finally:
        docker_client.close()


def test_a_docker_worker_without_its_daemon_does_not_start_and_says_why(env: Env) -> None:
    """It waits a while (dockerd may be starting too), then exits: without its daemon's queue
    it could place no run where the run's later turns would find it."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "-n", "nodocker@%h"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={
            **os.environ,
            **env.vars,
            "HARNESS_SANDBOX": "docker",
            "HARNESS_DOCKER_URL": "unix:///nonexistent/docker.sock",
            "HARNESS_METRICS_PORT": "0",
        },
    )
    assert done.returncode == 1
    assert "cannot ask the Docker daemon at unix:///nonexistent/docker.sock" in done.stderr
    assert "set HARNESS_HOST_QUEUE" in done.stderr


def test_reap_says_so_and_exits_1_when_the_daemon_is_unreachable(env: Env) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            **env.vars,
            "HARNESS_SANDBOX": "docker",
            "HARNESS_DOCKER_URL": "unix:///nonexistent/docker.sock",
        },
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("harness: cannot reap sandboxes: docker: cannot reach")
