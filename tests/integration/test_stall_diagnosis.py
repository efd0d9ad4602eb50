"""A stalled turn says what its harness was doing: its last event, the processes in its
sandbox and their connections; in the session-error, the log and ``harness status``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from sandbox.base import ExecSpec, Placement, RunSpec, SandboxError
from sandbox.docker.sandbox import DockerSandbox
from tests.conftest import ROOT
from tests.integration import docker_fixtures
from tests.integration.conftest import DEMO, Env, start_worker

docker_daemon = docker_fixtures.docker_daemon
demo_image = docker_fixtures.demo_image
docker_sandbox = docker_fixtures.docker_sandbox
docker_run = docker_fixtures.docker_run


@pytest.mark.redis
@pytest.mark.celery
def test_an_idle_timeout_says_what_the_harness_was_doing(env: Env) -> None:
    worker = start_worker(env, HARNESS_IDLE_TIMEOUT_S="4", HARNESS_STALL_REPORT_S="1")
    try:
        client = env.client()
        run_id = client.start_run("stdio-json", "@text working\n@sleep 60", executable=DEMO)
        deadline = time.monotonic() + 30
        silent = None
        while silent is None and time.monotonic() < deadline:
            silent = client.status(run_id)["silent_turn"]
            time.sleep(0.2)
        assert silent is not None, "no silent_turn while the harness slept"
        assert silent["turn"] == 1 and silent["last_event"] == "assistant-text"
        assert silent["silent_s"] >= 1
        assert "harness-demo" in silent["processes"]
        shown = subprocess.run(
            [sys.executable, "-m", "worker.cli", "status", run_id],
            cwd=ROOT,
            env={**os.environ, **env.vars},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "the last event was assistant-text" in shown.stdout, shown.stdout
        terminal = client.wait(run_id, 1, timeout=60)
    finally:
        worker.stop()
    assert terminal.type == "session-error" and terminal.data["reason"] == "timeout"
    error = terminal.data["error"]
    assert error.startswith("the harness produced no output for 4s: the last event was ")
    assert "assistant-text" in error
    assert "processes (pid state cpu command):" in error and "harness-demo" in error
    assert "no open TCP connection" in error
    assert "turn.stalled" in worker.logs()
    assert client.status(run_id)["silent_turn"] is None  # the turn is over


@pytest.mark.docker
def test_docker_lists_the_containers_processes_without_its_own_listing(
    docker_sandbox: DockerSandbox, docker_run: Callable[..., tuple[Placement, RunSpec]]
) -> None:
    placement, spec = docker_run()
    process = docker_sandbox.start(placement, ExecSpec(argv=("sleep", "37")), {})
    try:
        deadline = time.monotonic() + 10
        rows: list[str] = []
        while not any("sleep 37" in r for r in rows) and time.monotonic() < deadline:
            listed = docker_sandbox.processes(spec.run_id)
            rows = [row.command for row in listed.processes]
            time.sleep(0.2)
        assert any(r.startswith("sleep 37") for r in rows), rows
        assert not any("pid=,ppid=" in r for r in rows), rows
        sleeper = next(r for r in listed.processes if r.command.startswith("sleep 37"))
        assert sleeper.state == "S" and sleeper.cpu_s < 5
        assert "sleep 37" in listed.describe()
    finally:
        process.kill(grace=1)


@pytest.mark.docker
def test_an_image_without_ps_is_a_sandbox_error_not_an_empty_table(
    docker_sandbox: DockerSandbox, docker_run: Callable[..., tuple[Placement, RunSpec]]
) -> None:
    import io

    import docker

    docker_fixtures.ensure_images(["gateway"])  # a Debian image without procps
    tag = "harness-worker/test-no-ps:1"
    dockerfile = f"FROM {docker_fixtures.IMAGES['gateway']}\nENTRYPOINT []\nUSER 1000:1000\n"
    client = docker.from_env()
    try:
        client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="none", rm=True
        )
    finally:
        client.close()
    _, spec = docker_run(image=tag)
    with pytest.raises(SandboxError, match="cannot list the container's processes"):
        docker_sandbox.processes(spec.run_id)
