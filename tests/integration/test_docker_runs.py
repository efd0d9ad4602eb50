"""Turns through a real worker in real Docker containers: hardening, secrets, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import docker
import pytest

from tests.helpers import assert_one_terminal
from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

DEMO_IN_IMAGE = "harness-demo"
SECOND_DOCKERD = "unix:///run/harness-docker2.sock"


@pytest.fixture(scope="module")
def demo_image() -> str:
    require_docker()
    return ensure_images(["demo"])["demo"]


@pytest.fixture
def docker_env(env: Env, demo_image: str) -> Env:
    env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_ALLOWED_EXECUTABLES=DEMO_IN_IMAGE,
        HARNESS_HEARTBEAT_TTL_S="3",
    )
    return env


def containers_of(env: Env, url: str | None = None) -> list[docker.models.containers.Container]:
    client = docker.DockerClient(base_url=url) if url else docker.from_env()
    return client.containers.list(
        all=True, filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]}
    )


def reap(env: Env, **extra: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "reap", "--json"],
        capture_output=True,
        timeout=120,
        env={**os.environ, **env.vars, **extra},
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["removed"] for line in done.stdout.decode().splitlines()]


def test_run_container_is_hardened_and_keeps_its_workspace_between_turns(
    docker_env: Env, workers: list[WorkerProcess]
) -> None:
    workers.append(start_worker(docker_env))
    client = docker_env.client()
    run_id = client.start_run(
        "stdio-json", "@run touch /workspace/marker\n@run id -u", executable=DEMO_IN_IMAGE
    )
    first = client.wait(run_id, 1, timeout=60)
    assert first.type == "turn-complete"
    texts = [e.data["text"] for e in client.events(run_id) if e.type == "assistant-text"]
    assert "1000" in texts
    (container,) = containers_of(docker_env)
    assert client.status(run_id)["container_id"] == container.id
    host = container.attrs["HostConfig"]
    assert container.attrs["Config"]["User"] == "1000:1000"
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert host["PidsLimit"] > 0 and host["Memory"] > 0 and host["NanoCpus"] > 0
    assert [m["Destination"] for m in container.attrs["Mounts"]] == ["/workspace"]
    client.submit_turn(run_id, "@run ls /workspace")
    assert client.wait(run_id, 2, timeout=60).type == "turn-complete"
    texts = [
        e.data["text"] for e in client.events(run_id, after="2-0") if e.type == "assistant-text"
    ]
    assert any("marker" in t for t in texts)
    assert containers_of(docker_env)[0].id == container.id  # the same container
    client.end(run_id)
    assert containers_of(docker_env) == []


def test_only_granted_secrets_reach_the_harness_and_are_masked(
    docker_env: Env, workers: list[WorkerProcess]
) -> None:
    docker_env.vars["HARNESS_GRANTS"] = "stdio-json=DEMO_TOKEN"
    workers.append(
        start_worker(docker_env, DEMO_TOKEN="granted-value-123", WORKER_ONLY="worker-secret-456")
    )
    client = docker_env.client()
    run_id = client.start_run(
        "stdio-json",
        "@env DEMO_TOKEN\n@env WORKER_ONLY\n@env HARNESS_RUN_TOKEN",
        executable=DEMO_IN_IMAGE,
        grants=["DEMO_TOKEN"],
    )
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    texts = [e.data["text"] for e in client.events(run_id) if e.type == "assistant-text"]
    assert texts[0] == "DEMO_TOKEN=[masked]"
    assert texts[1] == "WORKER_ONLY=<unset>"
    assert texts[2] == "HARNESS_RUN_TOKEN=[masked]"
    assert client.status(run_id)["credential_live"] is True
    (container,) = containers_of(docker_env)
    assert "granted-value-123" not in json.dumps(container.attrs)
    client.end(run_id)
    assert client.status(run_id)["credential_live"] is False


def test_cancel_kills_the_harness_inside_the_container(
    docker_env: Env, workers: list[WorkerProcess]
) -> None:
    workers.append(start_worker(docker_env))
    client = docker_env.client()
    run_id = client.start_run(
        "stdio-json", "@fork 2\n@ignore-term\n@text busy\n@sleep 300", executable=DEMO_IN_IMAGE
    )
    for event in client.events(run_id, follow=True, timeout=60):
        if event.type == "assistant-text":
            break
    started = time.monotonic()
    client.cancel(run_id)
    terminal = client.wait(run_id, 1, timeout=10)
    assert time.monotonic() - started < 2.5
    assert terminal.data["reason"] == "cancelled"
    (container,) = containers_of(docker_env)
    top = container.top(ps_args="-eo pid,args")["Processes"]
    commands = [p[-1] for p in top]
    assert not any("harness-demo" in c or "time.sleep(3600)" in c for c in commands), commands
    client.end(run_id)


def test_oom_killed_harness_is_a_sandbox_error(
    docker_env: Env, workers: list[WorkerProcess]
) -> None:
    workers.append(start_worker(docker_env, HARNESS_MEMORY="96m"))
    client = docker_env.client()
    run_id = client.start_run(
        "stdio-json", "@text allocating\n@allocate 512", executable=DEMO_IN_IMAGE
    )
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.data["reason"] == "sandbox", terminal.data
    assert "memory limit" in terminal.data["error"]
    client.end(run_id)


def test_sigkilled_worker_leaves_a_run_its_next_turn_continues_in_the_same_container(
    docker_env: Env, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(docker_env)
    workers.append(worker)
    client = docker_env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 300", executable=DEMO_IN_IMAGE)
    for event in client.events(run_id, follow=True, timeout=60):
        if event.type == "assistant-text":
            break
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    [container] = containers_of(docker_env)
    time.sleep(3.5)  # the heartbeat lapses
    removed = reap(docker_env)
    assert f"closed turn {run_id}/1 (worker lost)" in removed
    assert f"removed sandbox of run {run_id}" not in removed  # one lost turn keeps its run
    assert client.wait(run_id, 1, timeout=5).data["reason"] == "worker-lost"
    assert client.status(run_id)["credential_live"] is False
    assert _harnesses_in(container), "the lost turn's harness should still be running"
    # A worker comes back on that daemon: the next turn runs in the same container, and
    # what the lost turn left running there is stopped first.
    workers.append(start_worker(docker_env))
    turn = client.submit_turn(run_id, "@text again")
    assert client.wait(run_id, turn, timeout=60).type == "turn-complete"
    assert [c.id for c in containers_of(docker_env)] == [container.id]
    assert _harnesses_in(container) == []
    client.end(run_id, timeout=60)
    assert containers_of(docker_env) == []


def _harnesses_in(container: docker.models.containers.Container) -> list[str]:
    return [" ".join(p) for p in container.top()["Processes"] if "harness-demo" in " ".join(p)]


@pytest.fixture
def second_daemon(demo_image: str) -> Iterator[str]:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run(
        [f"{repo}/scripts/second-dockerd", demo_image], check=True, capture_output=True, timeout=300
    )
    yield SECOND_DOCKERD
    # Leave it running for other tests; make sure it is up again if a test stopped it.
    subprocess.run(
        [f"{repo}/scripts/second-dockerd"], check=False, capture_output=True, timeout=300
    )


def _dockerd_pid() -> int:
    with open("/run/harness-docker2.pid") as f:
        return int(f.read().strip())


def test_turn_with_the_daemon_down_is_a_sandbox_error_and_doctor_says_so(
    docker_env: Env, workers: list[WorkerProcess], second_daemon: str
) -> None:
    docker_env.vars["HARNESS_DOCKER_URL"] = second_daemon
    workers.append(start_worker(docker_env))
    client = docker_env.client()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([f"{repo}/scripts/second-dockerd", "--stop"], check=True, timeout=60)
    run_id = client.start_run("stdio-json", "hello", executable=DEMO_IN_IMAGE)
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.data["reason"] == "sandbox"
    assert "cannot reach the Docker daemon" in terminal.data["error"]
    doctor = subprocess.run(
        [sys.executable, "-m", "worker.cli", "doctor", "--json"],
        capture_output=True,
        timeout=60,
        env={**os.environ, **docker_env.vars},
    )
    assert doctor.returncode == 1
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["docker"]["ok"] is False and checks["docker"]["fix"]


def test_daemon_restart_mid_turn_ends_the_turn_once(
    docker_env: Env, workers: list[WorkerProcess], second_daemon: str
) -> None:
    docker_env.vars["HARNESS_DOCKER_URL"] = second_daemon
    workers.append(start_worker(docker_env))
    client = docker_env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 300", executable=DEMO_IN_IMAGE)
    for event in client.events(run_id, follow=True, timeout=60):
        if event.type == "assistant-text":
            break
    os.kill(_dockerd_pid(), signal.SIGTERM)
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "session-error"
    assert terminal.data["reason"] in ("sandbox", "exit"), terminal.data
    assert_one_terminal([e for e in client.events(run_id) if e.turn == 1], turn=1)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([f"{repo}/scripts/second-dockerd"], check=True, capture_output=True, timeout=120)
    client.end(run_id)
    assert containers_of(docker_env, second_daemon) == []
