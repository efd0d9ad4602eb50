"""A run on network ``bridge`` (the default) reaches its model, its tools and the internet,
and nothing else: no other run, no service of the host, no private or link-local address
(the cloud metadata service), in real containers (sandbox/docker/isolation.py).

Before, runs shared Docker's default bridge: one tenant's run fetched another's over HTTP,
and reached every service of the host listening on 0.0.0.0 (the worker's metrics bound
there by default) and whatever the host routes to. Each case here connected then.

Stand-ins, all real: the "other run" is a second run's HTTP server; the host's services are
a listener of this test on 0.0.0.0 and a worker's own metrics endpoint; the metadata service
and a private host live in a network namespace routed from the host (169.254.169.254 and
10.213.7.2), beside a "public" address (11.22.33.44) that runs must still reach; the model
is the fake model server on docker0's address, allowed by HARNESS_BRIDGE_ALLOW.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.worker import remove_containers
from config import load_settings
from sandbox.base import ExecSpec, RunSpec, SandboxError
from sandbox.docker.sandbox import DockerSandbox
from sandbox.network import BridgeConfig, Destination
from tests.fakemodel.clis import raw_invocation
from tests.fakemodel.server import FakeModelServer
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.integration.docker_fixtures import ensure_images
from tests.security.conftest import docker_vars
from worker.cli import doctor
from worker.client import HarnessClient
from worker.observe import metrics

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("shipped_settings")]

# Run inside a container as the run's user: try each HOST:PORT argument, print one JSON
# object HOST:PORT -> "connected", "refused", "timeout" or the error.
PROBE = """
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        out[target] = "connected"
    except ConnectionRefusedError:
        out[target] = "refused"
    except socket.timeout:
        out[target] = "timeout"
    except OSError as exc:
        out[target] = type(exc).__name__ + ": " + str(exc)
    finally:
        s.close()
print(json.dumps(out))
"""
# Started by a run's harness: an HTTP server in the run's container, left running.
SERVE = """
import socket, subprocess, time
subprocess.Popen(["python3", "-m", "http.server", "8000"], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(50):
    try:
        socket.create_connection(("127.0.0.1", 8000), 1).close()
        print("listening on 8000")
        break
    except OSError:
        time.sleep(0.1)
"""


def hexed(code: str) -> str:
    """``code`` as one word of a harness-demo ``@run`` line (which splits on spaces)."""
    return f"exec(bytes.fromhex('{code.encode().hex()}').decode())"


def docker0() -> str:
    """The host's address on Docker's default bridge."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", "docker0"], capture_output=True, text=True
    ).stdout.split()
    return out[out.index("inet") + 1].split("/")[0]


def host_address() -> str:
    """The host's own address on its default route."""
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "get", "198.51.100.1"], capture_output=True, text=True
    ).stdout.split()
    return out[out.index("src") + 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener:
    """A host service on 0.0.0.0 that records who connected."""

    def __init__(self) -> None:
        peers = self.peers = []  # type: list[str]

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                peers.append(self.client_address[0])

        self._server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    served = Listener()
    yield served
    served.close()


@pytest.fixture(scope="module")
def outside() -> Iterator[dict[str, str]]:
    """A namespace routed from the host: the metadata address and a private host (which a run
    must not reach) and a public-looking one (which it must)."""
    tag = uuid.uuid4().hex[:6]
    ns, host_end, ns_end = f"hiso-{tag}", f"hvh-{tag}", f"hvn-{tag}"
    routes = ("169.254.169.254/32", "11.22.33.44/32")
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end],
        ["ip", "link", "set", ns_end, "netns", ns],
        ["ip", "addr", "add", "10.213.7.1/30", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "-n", ns, "addr", "add", "10.213.7.2/30", "dev", ns_end],
        ["ip", "-n", ns, "addr", "add", "169.254.169.254/32", "dev", "lo"],
        ["ip", "-n", ns, "addr", "add", "11.22.33.44/32", "dev", "lo"],
        ["ip", "-n", ns, "link", "set", ns_end, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", "10.213.7.1"],
        *(["ip", "route", "add", route, "via", "10.213.7.2"] for route in routes),
    ]
    server = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, "python3", "-m", "http.server", "80"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the host itself reaches all three
            try:
                for address in ("169.254.169.254", "10.213.7.2", "11.22.33.44"):
                    socket.create_connection((address, 80), 1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the namespace's server did not come up")
        yield {
            "metadata": "169.254.169.254:80",
            "private": "10.213.7.2:80",
            "public": "11.22.33.44:80",
        }
    finally:
        if server is not None:
            server.kill()
            server.wait(5)
        for route in routes:
            subprocess.run(["ip", "route", "del", route], capture_output=True)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def probe(container: Any, *targets: str) -> dict[str, str]:
    code, out = container.exec_run(["python3", "-c", PROBE, *targets], user="1000:1000")
    assert code == 0, out
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def address_of(container: Any) -> str:
    container.reload()
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    return str(network["IPAddress"])


def gateway_of(container: Any) -> str:
    container.reload()
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    return str(network["Gateway"])


# -- two runs of a real worker on the default network --------------------------------------------


@pytest.fixture(scope="module")
def bridge_env(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, demo_image: str
) -> Iterator[Env]:
    ensure_images(["gateway"])  # its iptables installs the host's rules
    env = make_env(
        tmp_path_factory.mktemp("isolation"),
        redis_url,
        **docker_vars(HARNESS_NETWORK="bridge", HARNESS_ALLOWED_NETWORKS="bridge"),
    )
    yield env
    env.close()
    remove_containers(env.prefix)  # (the network is the host's, shared: it stays)


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def bridge_worker(bridge_env: Env, metrics_port: int) -> Iterator[WorkerProcess]:
    # The shipped network (bridge) and metrics address (none given): the defaults.
    assert "HARNESS_METRICS_ADDR" not in bridge_env.vars
    worker = start_worker(bridge_env, HARNESS_METRICS_PORT=str(metrics_port))
    yield worker
    worker.stop()


def texts(client: HarnessClient, run_id: str, turn: int) -> list[str]:
    return [
        str(e.data.get("text", ""))
        for e in client.events(run_id)
        if e.turn == turn and e.type == "assistant-text"
    ]


@pytest.mark.redis
@pytest.mark.celery
def test_a_run_reaches_neither_another_run_nor_the_hosts_services(
    bridge_env: Env, bridge_worker: WorkerProcess, listener: Listener, metrics_port: int
) -> None:
    tenant_a, tenant_b = bridge_env.client(), bridge_env.client()
    # Run A serves HTTP from its container while its turn goes on.
    run_a = tenant_a.start_run(
        "stdio-json",
        f"@run python3 -c {hexed(SERVE)}\n@sleep 60\n@complete done",
        executable="harness-demo",
    )
    deadline = time.monotonic() + 60
    while "listening on 8000" not in texts(tenant_a, run_a, 1):
        assert time.monotonic() < deadline, tenant_a.events(run_a)
        time.sleep(0.2)
    client = docker.from_env()
    try:
        container_a = client.containers.get(tenant_a.status(run_a)["container_id"])
        assert probe(container_a, "127.0.0.1:8000") == {"127.0.0.1:8000": "connected"}
        a_address, gateway = address_of(container_a), gateway_of(container_a)
        targets = [
            f"{a_address}:8000",  # the other run
            *(f"{h}:{listener.port}" for h in (gateway, docker0(), host_address())),
            *(f"{h}:{metrics_port}" for h in (gateway, docker0(), host_address())),
        ]
        run_b = tenant_b.start_run(
            "stdio-json",
            f"@run python3 -c {hexed(PROBE)} {' '.join(targets)}\n@complete probed",
            executable="harness-demo",
        )
        assert tenant_b.wait(run_b, 1, timeout=90).type == "turn-complete"
        (seen,) = [json.loads(t) for t in texts(tenant_b, run_b, 1) if t.startswith("{")]
        container_b = client.containers.get(tenant_b.status(run_b)["container_id"])
        b_address = address_of(container_b)
    finally:
        client.close()
        tenant_a.cancel(run_a)
    assert seen == dict.fromkeys(targets, "refused"), seen
    assert b_address not in listener.peers and a_address not in listener.peers
    # The worker's metrics are served, on this machine's loopback only (the default).
    with socket.create_connection(("127.0.0.1", metrics_port), 3):
        pass
    with pytest.raises(OSError):
        socket.create_connection((docker0(), metrics_port), 3).close()


def test_the_metrics_endpoint_binds_loopback_by_default() -> None:
    assert load_settings().metrics_addr == "127.0.0.1"
    port = free_port()
    assert metrics.serve(port)
    with socket.create_connection(("127.0.0.1", port), 3):
        pass
    with pytest.raises(OSError):
        socket.create_connection((host_address(), port), 3).close()


# -- one run's reach, address by address --------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer("text", host=docker0()) as fake:
        yield fake


@pytest.fixture(scope="module")
def sandbox(
    tmp_path_factory: pytest.TempPathFactory, demo_image: str, model: FakeModelServer
) -> Iterator[DockerSandbox]:
    ensure_images(["gateway"])
    scope = f"test-{uuid.uuid4().hex[:12]}"
    allowed = Destination.parse(f"{docker0()}:{model.port}")
    made = DockerSandbox(
        tmp_path_factory.mktemp("isolated"), scope=scope, bridge=BridgeConfig(allow=(allowed,))
    )
    yield made
    for found in made.managed():
        made.teardown(found.run_id)
    assert made.bridge is not None
    made.bridge.remove()  # this allowlist's network: this test's alone


def start(sandbox: DockerSandbox, image: str) -> Any:
    spec = RunSpec(run_id=f"t{uuid.uuid4().hex[:12]}", image=image, network="bridge")
    placement = sandbox.prepare(spec)
    return placement, docker.from_env().containers.get(placement.container_id)


def test_the_metadata_service_and_private_addresses_are_out_of_reach_the_internet_is_not(
    sandbox: DockerSandbox, demo_image: str, outside: dict[str, str]
) -> None:
    _, container = start(sandbox, demo_image)
    seen = probe(container, outside["metadata"], outside["private"], outside["public"])
    assert seen == {
        outside["metadata"]: "refused",
        outside["private"]: "refused",
        outside["public"]: "connected",
    }


def test_the_model_is_reached_where_the_operator_allows_it_and_only_there(
    sandbox: DockerSandbox, model: FakeModelServer, listener: Listener
) -> None:
    placement, container = start(sandbox, ensure_images(["clis"])["clis"])
    before = len(model.requests)
    invocation = raw_invocation(
        "claude-code", prompt="Say hello", home=placement.home, base_url=model.url
    )
    env = {k: v for k, v in invocation.env.items() if k != "HOME"}
    process = sandbox.start(
        placement,
        ExecSpec(argv=tuple(invocation.argv), env=env, files=invocation.files, stdin=b""),
        invocation.secrets,
    )
    err = bytearray()
    try:
        deadline = time.monotonic() + 120
        while not process.eof:
            assert time.monotonic() < deadline, "the CLI did not end"
            chunk = process.read(0.5)
            if chunk is not None and chunk.stream == "stderr":
                err.extend(chunk.data)
        assert process.wait(5) == 0, err.decode(errors="replace")[-2000:]
    finally:
        process.kill()
    assert len(model.requests) > before, "the CLI never reached the allowed model server"
    # The same host, another port: refused.
    other = f"{docker0()}:{listener.port}"
    assert probe(container, other) == {other: "refused"}


def test_the_reaper_puts_back_the_rules_a_firewall_reload_removed(
    sandbox: DockerSandbox, demo_image: str, listener: Listener
) -> None:
    _, container = start(sandbox, demo_image)
    target = f"{docker0()}:{listener.port}"
    assert sandbox.bridge is not None
    client = docker.from_env()
    try:
        digest = str(client.networks.get(sandbox.bridge.network_name).id)[:12]
    finally:
        client.close()
    jump = ["INPUT", "-i", f"br-{digest}", "-j", f"HRUN-I-{digest}"]
    subprocess.run(["iptables", "-D", *jump], check=True)  # what a firewall reload does
    try:
        assert probe(container, target) == {target: "connected"}  # the hole it leaves
    finally:
        done = sandbox.reap_gateway()
    assert done is not None and "restored the isolation rules" in done
    assert probe(container, target) == {target: "refused"}
    assert sandbox.reap_gateway() is None  # nothing missing: nothing done


@pytest.mark.slow
def test_a_daemon_without_iptables_refuses_bridge_runs_saying_why(
    tmp_path: Path, demo_image: str
) -> None:
    gateway = ensure_images(["gateway"])["gateway"]
    second = subprocess.run(
        [str(Path(__file__).resolve().parents[2] / "scripts" / "second-dockerd"), gateway],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    ).stdout.strip()
    scope = f"test-{uuid.uuid4().hex[:12]}"
    made = DockerSandbox(tmp_path, base_url=second, scope=scope)
    spec = RunSpec(run_id=f"t{uuid.uuid4().hex[:12]}", image=demo_image, network="bridge")
    try:
        with pytest.raises(SandboxError, match="--iptables=false") as refused:
            made.prepare(spec)
        assert "HARNESS_BRIDGE_ISOLATION" in refused.value.hint
        assert made.managed() == []  # no container started unisolated
        settings = load_settings(docker_url=second, key_prefix=scope)
        check = doctor.bridge_check(settings)
        assert check.level == "fail" and "--iptables=false" in check.detail
    finally:
        assert made.bridge is not None
        with contextlib.suppress(SandboxError):
            made.bridge.remove()
