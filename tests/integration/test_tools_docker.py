"""The run's tools from inside a Docker container under network ``none`` and ``bridge``: the
endpoint's socket reaches the sandbox through the workspace's bind mount, with no route to
the host. An operator's MCP server is forwarded with its headers, which never enter the
container, the stream, the record or the worker's log."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import docker
import pytest

from tests.conftest import ROOT
from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from tests.integration.test_tools_worker import Servers, of

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

UPSTREAM_TOKEN = "op-secret-5c1f0e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def upstream() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/integration/upstream_mcp.py"), str(port), UPSTREAM_TOKEN]
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def docker_env(env: Env, upstream: int) -> Env:
    require_docker()
    ensure_images(["demo"])
    servers = {
        "ops": {
            "url": f"http://127.0.0.1:{upstream}/mcp",
            "headers": {"Authorization": f"Bearer {UPSTREAM_TOKEN}"},
        }
    }
    env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_ALLOWED_EXECUTABLES="harness-demo",
        HARNESS_MCP_SERVERS=json.dumps(servers),
        HARNESS_TOOL_CALL_TIMEOUT_S="20",
    )
    return env


@pytest.fixture
def docker_worker(docker_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(docker_env)
    yield worker
    worker.stop()


@pytest.mark.parametrize("network", ["none", "bridge"])
def test_a_containers_harness_calls_a_producer_tool_and_an_operator_server(
    docker_env: Env, docker_worker: WorkerProcess, network: str
) -> None:
    servers = Servers(docker_env)
    servers.start()
    try:
        client = docker_env.client()
        script = (
            '@tool orders lookup {"order_id": 4}\n'
            '@tool ops weather {"city": "Lyon"}\n'
            "@run sh -c printenv>env.txt\n"
            "@run sh -c cat<$HARNESS_MCP_CONFIG>mcp.txt"
        )
        run_id = client.start_run(
            "stdio-json",
            script,
            executable="harness-demo",
            network=network,
            tools=["orders"],
            mcp=["ops"],
        )
        assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
        texts = [e.data["text"] for e in client.events(run_id) if e.type == "assistant-text"]
        assert 'tool orders.lookup ok: {"id":4,"status":"shipped"}' in texts
        assert "tool ops.weather ok: sunny in Lyon" in texts
        assert [r["ok"] for r in of(client, run_id, "tool-result")] == [True, True]
        record = client.status(run_id)
        workspace = docker_env.tmp / "workspaces" / "docker" / "run" / run_id
        inside = "\n".join(
            p.read_text(errors="replace") for p in workspace.rglob("*") if p.is_file()
        )
        assert "HARNESS_RUN_TOKEN=" in inside and "mcpServers" in inside  # what the harness saw
        container = docker.from_env().containers.get(record["container_id"])
        seen = [
            inside,
            json.dumps(container.attrs),
            json.dumps([e.data for e in client.events(run_id)]),
            json.dumps(record),
            docker_worker.logs(),
        ]
        assert not [i for i, text in enumerate(seen) if UPSTREAM_TOKEN in text]
        client.end(run_id)
    finally:
        servers.stop()
