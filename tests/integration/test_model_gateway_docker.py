"""The model gateway for a harness in a Docker container: a real worker process, the demo
harness asking the fake model server (on this host's loopback, which no run can reach) through
the relay on the container's own loopback, under network ``none``, ``bridge`` and ``egress``
(whose egress gateway never sees the model's traffic).

The real key is nowhere the run can see: not in the container's environment (``docker
inspect``), any process's ``/proc/*/environ``, any file of the container or its workspace, the
stream, the record or the worker's log; the upstream sees it on every request."""

from __future__ import annotations

import json
from collections.abc import Iterator

import docker
import pytest

from sandbox.docker.gateway import remove_stale
from tests.fakemodel import FakeModelServer
from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

REAL = "sk-operator-docker-4e1d77b2c9"
ASK = "@model OPENAI_API_KEY fake-model hello"


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


EGRESS_SUBNET = "172.30.236.0/24"
"""This module's egress network (the e2e suite's are 172.30.210-213.0/24)."""


@pytest.fixture
def worker(env: Env, fake: FakeModelServer) -> Iterator[WorkerProcess]:
    require_docker()
    ensure_images(["demo", "gateway"])
    client = docker.from_env()
    remove_stale(client, EGRESS_SUBNET)
    env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_ALLOWED_NETWORKS="none,bridge,egress",
        HARNESS_EGRESS_SUBNET=EGRESS_SUBNET,
        HARNESS_ALLOWED_EXECUTABLES="harness-demo",
        HARNESS_GRANTS="stdio-json=OPENAI_API_KEY",
        HARNESS_MODEL_UPSTREAMS=f"stdio-json={fake.url}/v1",
        OPENAI_API_KEY=REAL,
    )
    started = start_worker(env)
    yield started
    started.stop()
    remove_stale(client, EGRESS_SUBNET)


def key_in_container(container: object) -> list[str]:
    """Where REAL is in the container: any process's environment, any file (as root)."""
    # Each top-level directory but the kernel's (a grep -r of / itself wanders into them).
    script = (
        f"grep -l -F -- '{REAL}' /proc/[0-9]*/environ 2>/dev/null; for d in /*; do "
        "case $d in /proc|/sys|/dev) continue;; esac; "
        f"grep -r -l -s -D skip -F -- '{REAL}' \"$d\"; done; true"
    )
    _, out = container.exec_run(["sh", "-c", script], user="0:0")  # type: ignore[attr-defined]
    return out.decode().split()


@pytest.mark.parametrize("network", ["none", "bridge", "egress"])
def test_a_container_reaches_its_model_only_through_the_gateway_and_never_holds_the_key(
    env: Env, worker: WorkerProcess, fake: FakeModelServer, network: str
) -> None:
    client = env.client()
    script = f"@run cp /proc/self/environ held-env\n{ASK}\n@sleep 1\n@complete done"
    run_id = client.start_run(
        "stdio-json", script, executable="harness-demo", network=network, grants=["OPENAI_API_KEY"]
    )
    terminal = client.wait(run_id, 1, timeout=120)
    events = list(client.events(run_id))
    assert terminal.type == "turn-complete", [(e.type, e.data) for e in events]
    texts = [e.data["text"] for e in events if e.type == "assistant-text"]
    assert any("Hello from" in t for t in texts), texts
    (request,) = fake.model_requests()
    assert request.credentials == (REAL,)

    record = client.status(run_id)
    workspace = env.tmp / "workspaces" / "docker" / "run" / run_id
    held = dict(
        e.split("=", 1) for e in (workspace / "held-env").read_text().split("\0") if "=" in e
    )
    standin = held["OPENAI_API_KEY"]
    assert standin.startswith("hwgw_")
    container = docker.from_env().containers.get(record["container_id"])
    assert key_in_container(container) == []
    inside = "\n".join(p.read_text(errors="replace") for p in workspace.rglob("*") if p.is_file())
    seen = {
        "workspace": inside,
        "inspect": json.dumps(container.attrs),
        "stream": json.dumps([e.data for e in events]),
        "record": json.dumps(record),
        "worker log": worker.logs(),
    }
    assert [where for where, text in seen.items() if REAL in text] == []
    usage = [e.data for e in events if e.type == "usage" and e.data["source"] == "gateway"]
    assert len(usage) == 1 and usage[0]["input_tokens"] > 0, [(e.type, e.data) for e in events]
    assert record["gateway_requests"] == 1

    # The stand-in is worth nothing elsewhere: the upstream itself would get it as it is.
    client.end(run_id)


def test_a_relay_port_squatted_by_an_earlier_turn_is_freed_for_the_next(
    env: Env, worker: WorkerProcess
) -> None:
    client = env.client()
    # Turn 1 leaves a listener of its own on the relay's port in the container...
    squat = (
        "@run python3 -c import socket,os,time;s=socket.socket();s.bind(('127.0.0.1',47311));"
        "s.listen();os.fork()or[time.sleep(600)]\n@complete squatted"
    )
    run_id = client.start_run(
        "stdio-json", squat, executable="harness-demo", grants=["OPENAI_API_KEY"]
    )
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    # ...which the next turn's start kills (a process of an earlier turn): the relay binds.
    client.submit_turn(run_id, f"{ASK}\n@complete done")
    terminal = client.wait(run_id, 2, timeout=120)
    assert terminal.type == "turn-complete", terminal.data
    client.end(run_id)


def test_no_route_is_left_listening_after_the_turn(env: Env, worker: WorkerProcess) -> None:
    client = env.client()
    run_id = client.start_run(
        "stdio-json", f"{ASK}\n@complete done", executable="harness-demo",
        grants=["OPENAI_API_KEY"],
    )  # fmt: skip
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    container = docker.from_env().containers.get(client.status(run_id)["container_id"])
    # The gateway's socket goes with the turn; the relay leaves once its harness is gone.
    probe = (
        "import socket,os,time\n"
        "gone=os.path.exists(os.environ['HOME']+'/.harness-endpoint/model.sock')\n"
        "for _ in range(50):\n"
        "    if socket.socket().connect_ex(('127.0.0.1',47311)):break\n"
        "    time.sleep(0.1)\n"
        "print(socket.socket().connect_ex(('127.0.0.1',47311)),gone)"
    )
    _, out = container.exec_run(["python3", "-c", probe], environment={"HOME": "/workspace/.home"})
    refused, socket_left = out.decode().split()
    assert int(refused) != 0 and socket_left == "False", out
    client.end(run_id)
