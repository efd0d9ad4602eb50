"""Network ``egress``, attacked from inside a run: nothing but the allowlist gets out, and each
refusal is immediate (a 403 naming the rule, a reset, an ICMP error), never a silent drop.

One lab per module (one gateway, one run container on the egress network, made through
:class:`DockerSandbox` as a worker makes them), and test servers of our own on docker0's
address (172.17.0.1), on an IPv6 address of a bridge interface we create, and a DNS server of
ours that the gateway uses. No test aims at any other address.

Each attack runs as the harness user in the run's container (Python of the demo image) and
prints one JSON line: what happened and how long it took.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import socket
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import pytest

from sandbox.base import RunSpec
from sandbox.docker.container import container_name
from sandbox.docker.gateway import remove_stale
from sandbox.docker.sandbox import DockerSandbox
from sandbox.network import LABEL_BASE_URL, LABEL_HARNESS, EgressConfig, Endpoint
from tests.integration.docker_fixtures import ensure_images

pytestmark = [pytest.mark.docker]

HOST = "172.17.0.1"
"""docker0's address: our test servers listen there; the gateway reaches it."""
V6_LINK = "hw-egress-v6"
V6_ADDR = "fd42:4861:7277::1"
"""A ULA address we put on a bridge interface of our own for the IPv6 attempts."""
SUBNET = "172.30.190.0/24"
FAST_S = 2.0
"""A refusal takes less than this (a silent drop would take the client's whole timeout)."""


class _Counting(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.server.connections += 1  # type: ignore[attr-defined]
        super().setup()

    def do_GET(self) -> None:
        if self.path.startswith("/stream"):
            # Chunks over ~3 s: a tunnel that must survive a gateway reload.
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(10):
                data = f"chunk-{i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b"0\r\n\r\n")
            return
        body = self.server.reply  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _http_server(address: str, reply: bytes, family: int = socket.AF_INET) -> Any:
    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((address, 0), _Counting)
    server.connections = 0  # type: ignore[attr-defined]
    server.reply = reply  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _DNS(socketserver.BaseRequestHandler):
    """Answers every A query with 127.0.0.1 (``sneaky.test`` is an allowed name that resolves
    to loopback) and remembers each name asked."""

    def handle(self) -> None:
        data, sock = self.request
        self.server.names.append(_qname(data))  # type: ignore[attr-defined]
        question_end = 12 + len(_qname_bytes(data)) + 4
        answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04" + socket.inet_aton("127.0.0.1")
        header = data[:2] + b"\x81\x80" + data[4:6] + b"\x00\x01\x00\x00\x00\x00"
        sock.sendto(header + data[12:question_end] + answer, self.client_address)


def _qname_bytes(data: bytes) -> bytes:
    end = data.index(b"\x00", 12) + 1
    return data[12:end]


def _qname(data: bytes) -> str:
    raw, labels, i = _qname_bytes(data), [], 0
    while raw[i]:
        labels.append(raw[i + 1 : i + 1 + raw[i]].decode("ascii", "replace"))
        i += raw[i] + 1
    return ".".join(labels).lower()


@dataclass
class Lab:
    sandbox: DockerSandbox
    run_id: str
    container: Any
    allowed: Any
    forbidden: Any
    metrics: Any
    v6: Any
    dns: Any
    udp_seen: list[bytes]
    udp_port: int
    config: EgressConfig
    started: float = field(default_factory=time.time)

    def attack(self, code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run ``code`` (Python; it sets ``result``) as the harness user; its outcome."""
        wrapper = (
            "import json, time, socket, os, urllib.request\n"
            "t = time.monotonic()\n"
            "try:\n" + "".join(f"    {line}\n" for line in code.strip().splitlines()) + ""
            "    outcome = {'ok': True, 'result': repr(result)[:300]}\n"
            "except BaseException as e:\n"
            "    outcome = {'ok': False, 'error': type(e).__name__, 'detail': str(e)[:300]}\n"
            "outcome['seconds'] = time.monotonic() - t\n"
            "print(json.dumps(outcome))\n"
        )
        code_, out = self.container.exec_run(
            ["python3", "-c", wrapper], user="1000:1000", environment=env or {}
        )
        lines = out.decode().strip().splitlines()
        assert code_ == 0 and lines, out.decode()
        return dict(json.loads(lines[-1]))

    def denials(self, since: float) -> list[Any]:
        return self.sandbox.network_denials(self.run_id, since, time.time())


def _refused_fast(outcome: dict[str, Any], *errors: str) -> None:
    assert not outcome["ok"], outcome
    assert outcome["seconds"] < FAST_S, outcome
    if errors:
        assert outcome["error"] in errors, outcome


def _dns_server() -> socketserver.ThreadingUDPServer:
    """The forbidden resolver on HOST:53. Something else held that port for a moment once,
    in a CI run with another suite beside it (not found since): wait it out, and say who
    holds it if it stays taken."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return socketserver.ThreadingUDPServer((HOST, 53), _DNS)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                held = subprocess.run(["ss", "-uanp"], capture_output=True, text=True).stdout
                raise OSError(f"{HOST}:53 stays taken: {held[-2000:]}") from exc
            time.sleep(0.5)


def _served(stack: contextlib.ExitStack, server: Any) -> Any:
    """``server`` (serving on a thread) stopped and its socket closed when ``stack`` unwinds."""
    stack.callback(server.server_close)
    stack.callback(server.shutdown)
    return server


def _closed(stack: contextlib.ExitStack, sock: socket.socket) -> socket.socket:
    """``sock`` shut down (which wakes a thread blocked in its ``recv``: a close alone leaves
    the socket bound while that call waits) and closed when ``stack`` unwinds."""

    def close() -> None:
        with contextlib.suppress(OSError):  # ENOTCONN for UDP, after waking the reader
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    stack.callback(close)
    return sock


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, demo_image: str) -> Iterator[Lab]:
    """Everything made is undone whichever step fails, the set-up's included: a set-up that
    failed half-way once left HOST:53 bound in this process, and every later set-up of the
    module's lab then found the port taken."""
    ensure_images(["gateway"])
    with contextlib.ExitStack() as stack:
        client = docker.from_env()
        stack.callback(client.close)
        remove_stale(client, SUBNET)  # what a killed run of this module left
        scope = f"egress-sec-{uuid.uuid4().hex[:8]}"
        allowed = _served(stack, _http_server(HOST, b"allowed-server-reply"))
        forbidden = _served(stack, _http_server(HOST, b"forbidden-server-reply"))
        # a metrics port's stand-in
        metrics = _served(stack, _http_server(HOST, b"harness_turns_started_total 1\n"))
        stack.callback(subprocess.run, ["ip", "link", "del", V6_LINK], check=False)
        subprocess.run(["ip", "link", "add", V6_LINK, "type", "bridge"], check=False)
        subprocess.run(["ip", "addr", "add", f"{V6_ADDR}/64", "dev", V6_LINK, "nodad"], check=False)
        subprocess.run(["ip", "link", "set", V6_LINK, "up"], check=True)
        time.sleep(1.5)  # duplicate address detection
        v6 = _served(stack, _http_server(V6_ADDR, b"v6-reply", socket.AF_INET6))
        dns = _dns_server()
        dns.names = []  # type: ignore[attr-defined]
        threading.Thread(target=dns.serve_forever, daemon=True).start()
        _served(stack, dns)
        udp = _closed(stack, socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        udp.bind((HOST, 0))
        udp_seen: list[bytes] = []

        def receive() -> None:
            with contextlib.suppress(OSError):
                while True:
                    data = udp.recv(2048)
                    if not data:  # shut down
                        return
                    udp_seen.append(data)

        threading.Thread(target=receive, daemon=True).start()
        config = EgressConfig(
            scope=scope,
            subnet=SUBNET,
            hosts={"allowed.test": HOST, "forbidden.test": HOST},
            resolvers=(HOST,),
            allow={
                "stdio-json": (
                    Endpoint("allowed.test", allowed.server_address[1]),
                    Endpoint("sneaky.test", 6379),
                )
            },
        )
        sandbox = DockerSandbox(tmp_path_factory.mktemp("egress-sec"), scope=scope, egress=config)

        def remove_gateway() -> None:
            if sandbox.egress is not None:
                sandbox.egress.remove()

        stack.callback(remove_gateway)
        run_id = "r" + uuid.uuid4().hex[:24]
        stack.callback(sandbox.teardown, run_id)
        placement = sandbox.prepare(
            RunSpec(
                run_id=run_id,
                image=demo_image,
                network="egress",
                labels={LABEL_HARNESS: "stdio-json", LABEL_BASE_URL: ""},
            )
        )
        container = client.containers.get(placement.container_id)
        yield Lab(
            sandbox,
            run_id,
            container,
            allowed,
            forbidden,
            metrics,
            v6,
            dns,
            udp_seen,
            int(udp.getsockname()[1]),
            config,
        )


@pytest.fixture
def untouched(lab: Lab) -> Iterator[None]:
    """The forbidden servers see no connection, no datagram and no query during the test."""
    before = (lab.forbidden.connections, lab.metrics.connections, lab.v6.connections)
    seen = len(lab.udp_seen)
    yield
    assert (lab.forbidden.connections, lab.metrics.connections, lab.v6.connections) == before
    assert len(lab.udp_seen) == seen


NO_PROXY = {"NO_PROXY": "*", "no_proxy": "*"}


def _proxy_get(url: str, timeout: float = 10) -> str:
    return f"result = urllib.request.urlopen({url!r}, timeout={timeout}).read()"


# -- what is allowed works ------------------------------------------------------------------


def test_allowed_host_and_port_are_reached_through_the_proxy(lab: Lab) -> None:
    port = lab.allowed.server_address[1]
    outcome = lab.attack(_proxy_get(f"http://allowed.test:{port}/"))
    assert outcome["ok"] and "allowed-server-reply" in outcome["result"], outcome


def test_a_reload_keeps_tunnels_in_flight_and_a_policy_change_applies_without_restart(
    lab: Lab,
) -> None:
    """A long response through the proxy while the gateway's configuration changes twice:
    the tunnel is kept; the new policy holds for new connections at once."""
    port = lab.allowed.server_address[1]
    assert lab.sandbox.egress is not None
    result: dict[str, Any] = {}
    reader = threading.Thread(
        target=lambda: result.update(lab.attack(_proxy_get(f"http://allowed.test:{port}/stream")))
    )
    reader.start()
    time.sleep(0.8)
    stricter = EgressConfig(**{**lab.config.__dict__, "allow": {"stdio-json": ()}})
    gateway = type(lab.sandbox.egress)(stricter, lab.sandbox.egress._client, lab.sandbox._seam)
    gateway.sync()  # what a worker with the new policy does
    refused = lab.attack(_proxy_get(f"http://allowed.test:{port}/"))
    lab.sandbox.egress._pushed = ""
    lab.sandbox.egress.sync()  # and back
    reader.join(20)
    assert result.get("ok") and "chunk-9" in result["result"], result
    _refused_fast(refused, "HTTPError")
    assert "403" in refused["detail"], refused


# -- the proxy refuses, naming the rule --------------------------------------------------------


def test_a_host_not_allowed_is_refused_by_name_and_reported(lab: Lab, untouched: None) -> None:
    since = time.time()
    port = lab.forbidden.server_address[1]
    outcome = lab.attack(_proxy_get(f"http://forbidden.test:{port}/"))
    _refused_fast(outcome, "HTTPError")
    assert "403" in outcome["detail"]
    body = lab.attack(
        "try:\n"
        f"    urllib.request.urlopen('http://forbidden.test:{port}/', timeout=5)\n"
        "except urllib.error.HTTPError as e:\n"
        "    result = e.read().decode()\n"
    )
    assert "rule not-allowed" in body["result"], body
    (first, *_) = [d for d in lab.denials(since) if d.host == "forbidden.test"]
    assert (first.port, first.protocol, first.rule) == (port, "http", "not-allowed")


def test_a_raw_ip_is_refused_through_the_proxy(lab: Lab, untouched: None) -> None:
    port = lab.forbidden.server_address[1]
    since = time.time()
    _refused_fast(lab.attack(_proxy_get(f"http://{HOST}:{port}/")), "HTTPError")
    assert any(d.host == HOST and d.port == port for d in lab.denials(since))


def test_an_allowed_name_on_another_port_is_refused(lab: Lab, untouched: None) -> None:
    port = lab.forbidden.server_address[1]  # allowed.test is the same address
    _refused_fast(lab.attack(_proxy_get(f"http://allowed.test:{port}/")), "HTTPError")


def test_an_allowed_name_resolving_to_loopback_is_refused_as_private(lab: Lab) -> None:
    """``sneaky.test:6379`` is in the allowlist, but our DNS server says 127.0.0.1: the
    gateway resolves it itself, sees a private address that policy does not pin, refuses."""
    since = time.time()
    outcome = lab.attack(
        "s = socket.create_connection(('172.30.190.1', 3128), timeout=5)\n"
        "s.sendall(b'CONNECT sneaky.test:6379 HTTP/1.1\\r\\nHost: sneaky.test:6379\\r\\n\\r\\n')\n"
        "result = s.recv(4096).decode()\n"
        "assert ' 200 ' not in result.split('\\r\\n')[0], result\n"
        "raise RuntimeError(result.split('\\r\\n')[0] + ' ' + result[-200:])\n"
    )
    _refused_fast(outcome, "RuntimeError")
    assert "403" in outcome["detail"] and "private-address" in outcome["detail"], outcome
    assert "sneaky.test" in lab.dns.names  # resolved by the gateway, with our DNS server
    assert any(d.host == "sneaky.test" and d.rule == "private-address" for d in lab.denials(since))


def test_connect_relays_do_not_reach_a_host_that_is_not_allowed(lab: Lab, untouched: None) -> None:
    """An absolute URL for a forbidden host with an allowed Host header; a CONNECT inside an
    allowed tunnel (the allowed server is no proxy: it cannot relay); the gateway as its own
    relay; a userinfo trick."""
    port, bad = lab.allowed.server_address[1], lab.forbidden.server_address[1]
    proxy = "('172.30.190.1', 3128)"
    for request in (
        f"GET http://forbidden.test:{bad}/ HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n\\r\\n",
        f"CONNECT 172.30.190.1:3128 HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n\\r\\n",
        f"CONNECT allowed.test:{port}@forbidden.test:{bad} HTTP/1.1\\r\\n\\r\\n",
        f"GET http://allowed.test:{port}@forbidden.test:{bad}/ HTTP/1.1\\r\\n\\r\\n",
    ):
        outcome = lab.attack(
            f"s = socket.create_connection({proxy}, timeout=5)\n"
            f"s.sendall(b'{request}')\n"
            "head = s.recv(4096).decode().split('\\r\\n')[0]\n"
            "if ' 200 ' in head:\n"
            "    s.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
            "    for chunk in iter(lambda: s.recv(4096), b''):\n"
            "        head += ' then ' + chunk.decode()\n"
            "result = head\n"
        )
        assert outcome["ok"] and outcome["seconds"] < FAST_S, (request, outcome)
        # Refused, or (squid reads ``host:port@...`` as the allowed authority) a tunnel to
        # the allowed server itself; the forbidden server sees nothing either way.
        assert " 200 " not in outcome["result"] or "allowed-server-reply" in outcome["result"], (
            request,
            outcome,
        )
    tunnelled = lab.attack(
        f"s = socket.create_connection({proxy}, timeout=5)\n"
        f"s.sendall(b'CONNECT allowed.test:{port} HTTP/1.1\\r\\n\\r\\n')\n"
        "assert b' 200 ' in s.recv(4096)\n"
        f"s.sendall(b'CONNECT forbidden.test:{bad} HTTP/1.1\\r\\n\\r\\n')\n"
        "result = s.recv(4096).decode().split('\\r\\n')[0]\n"
    )
    assert tunnelled["ok"] and " 200 " not in tunnelled["result"], tunnelled


def test_the_gateways_admin_interface_is_refused(lab: Lab) -> None:
    since = time.time()
    outcome = lab.attack(_proxy_get("http://172.30.190.1:3128/squid-internal-mgr/menu"))
    _refused_fast(outcome, "HTTPError")
    assert "403" in outcome["detail"], outcome
    # The gateway's own address: squid does not listen there, the connection is reset.
    direct = lab.attack(
        _proxy_get("http://172.30.190.2:3128/squid-internal-mgr/info"), env=NO_PROXY
    )
    _refused_fast(direct, "URLError", "ConnectionRefusedError")
    raw = lab.attack(
        "s = socket.create_connection(('172.30.190.1', 3128), timeout=5)\n"
        "s.sendall(b'GET cache_object://localhost/info HTTP/1.0\\r\\n\\r\\n')\n"
        "result = s.recv(4096).decode().split('\\r\\n')[0]\n"
    )
    assert raw["ok"] and " 200 " not in raw["result"], raw
    assert any(d.rule == "admin" for d in lab.denials(since))


# -- around the proxy: rejected at once by the gateway, reported ------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"HTTPS_PROXY": "", "HTTP_PROXY": "", "https_proxy": "", "http_proxy": ""},
        {"NO_PROXY": "*", "no_proxy": "*"},
        {"http_proxy": f"http://{HOST}:1", "HTTP_PROXY": f"http://{HOST}:1"},
    ],
    ids=["cleared", "no-proxy-star", "another-proxy"],
)
def test_tampered_proxy_variables_only_make_the_connection_fail(
    lab: Lab, untouched: None, env: dict[str, str]
) -> None:
    port = lab.forbidden.server_address[1]
    since = time.time()
    outcome = lab.attack(_proxy_get(f"http://{HOST}:{port}/"), env=env)
    _refused_fast(outcome, "URLError", "ConnectionRefusedError", "ConnectionResetError")
    assert any(d.rule == "direct" and d.host == HOST for d in lab.denials(since))


def test_a_direct_tcp_connection_is_reset_and_reported(lab: Lab, untouched: None) -> None:
    port = lab.forbidden.server_address[1]
    since = time.time()
    outcome = lab.attack(f"result = socket.create_connection(({HOST!r}, {port}), timeout=10)")
    _refused_fast(outcome, "ConnectionRefusedError")
    (denial,) = [d for d in lab.denials(since) if d.port == port]
    assert (denial.host, denial.protocol, denial.rule) == (HOST, "tcp", "direct")


@pytest.mark.parametrize(
    ("what", "port"),
    [("redis", 6379), ("docker-tcp", 2375), ("docker-tls", 2376), ("metrics", 0)],
)
def test_host_services_are_out_of_reach(lab: Lab, untouched: None, what: str, port: int) -> None:
    """Redis, Docker's TCP ports and the worker's metrics port, directly on the host's
    addresses and through the proxy (loopback and the host's bridge address)."""
    port = port or lab.metrics.server_address[1]
    for target in (HOST, "127.0.0.1", "172.30.190.1"):
        outcome = lab.attack(f"result = socket.create_connection(({target!r}, {port}), timeout=10)")
        _refused_fast(outcome)
    for target in (HOST, "127.0.0.1", "localhost", "172.30.190.1"):
        for request in (
            f"CONNECT {target}:{port} HTTP/1.1\\r\\n\\r\\n",
            f"GET http://{target}:{port}/ HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n",
        ):
            outcome = lab.attack(
                "s = socket.create_connection(('172.30.190.1', 3128), timeout=5)\n"
                f"s.sendall(b'{request}')\n"
                "result = s.recv(4096).decode().split('\\r\\n')[0]\n"
            )
            assert outcome["ok"] and " 403 " in outcome["result"], (request, outcome)
            assert outcome["seconds"] < FAST_S


def test_the_gateway_is_no_proxy_for_its_outside_network(lab: Lab, untouched: None) -> None:
    """A container on the gateway's outside network (runs on ``bridge``) finds no proxy on
    the gateway's address there."""
    client = docker.from_env()
    gateway = client.containers.get(lab.config.container_name)
    outside = gateway.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    port = lab.forbidden.server_address[1]
    probe = (
        "import socket\n"
        "try:\n"
        f"    s = socket.create_connection(({outside!r}, 3128), timeout=5)\n"
        f"    s.sendall(b'CONNECT forbidden.test:{port} HTTP/1.1\\r\\n\\r\\n')\n"
        "    print('answered', s.recv(100))\n"
        "except OSError as e:\n"
        "    print('refused', e)\n"
    )
    out = client.containers.run(
        lab.container.image.id, ["python3", "-c", probe], network="bridge", remove=True,
        user="1000:1000", cap_drop=["ALL"],
    )  # fmt: skip
    assert out.decode().startswith("refused"), out


def test_the_docker_socket_is_not_in_the_container(lab: Lab) -> None:
    outcome = lab.attack(
        "result = [p for p in ('/var/run/docker.sock', '/run/docker.sock',"
        " '/run/containerd/containerd.sock') if os.path.exists(p)]\n"
        "assert not result, result\n"
    )
    assert outcome["ok"], outcome


def test_raw_and_packet_sockets_are_refused(lab: Lab) -> None:
    for family, kind, proto in (
        ("socket.AF_INET", "socket.SOCK_RAW", "socket.IPPROTO_ICMP"),
        ("socket.AF_INET", "socket.SOCK_RAW", "socket.IPPROTO_TCP"),
        ("socket.AF_PACKET", "socket.SOCK_RAW", "0"),
        ("socket.AF_INET6", "socket.SOCK_RAW", "socket.IPPROTO_ICMPV6"),
    ):
        outcome = lab.attack(f"result = socket.socket({family}, {kind}, {proto})")
        _refused_fast(outcome, "PermissionError")


def test_ipv6_goes_nowhere(lab: Lab, untouched: None) -> None:
    port = lab.v6.server_address[1]
    for code in (
        f"result = socket.create_connection(({V6_ADDR!r}, {port}), timeout=10)",
        _proxy_get(f"http://[{V6_ADDR}]:{port}/"),
        f"s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        f"s.connect(({V6_ADDR!r}, {port}))\nresult = s.send(b'x')",
    ):
        _refused_fast(lab.attack(code))


def test_udp_and_quic_are_refused_at_once(lab: Lab, untouched: None) -> None:
    since = time.time()
    for port in (lab.udp_port, 443):
        outcome = lab.attack(
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.settimeout(10)\n"
            f"s.connect(({HOST!r}, {port}))\n"
            "s.send(bytes([0xc0]) + b'\\x00\\x00\\x00\\x01' + b'q' * 1200)\n"  # a QUIC Initial's shape
            "result = s.recv(2048)\n"
        )
        _refused_fast(outcome, "ConnectionRefusedError")
    reported = {(d.port, d.protocol) for d in lab.denials(since)}
    assert {(lab.udp_port, "udp"), (443, "udp")} <= reported


def test_dns_to_another_resolver_is_refused_over_udp_and_tcp(lab: Lab, untouched: None) -> None:
    asked = len([n for n in lab.dns.names if not n.endswith(".in-addr.arpa")])
    since = time.time()
    query = "0001010000010000000000000474657374076578616d706c650000010001"
    udp = lab.attack(
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(10)\n"
        f"s.connect(({HOST!r}, 53))\ns.send(bytes.fromhex({query!r}))\nresult = s.recv(512)\n"
    )
    _refused_fast(udp, "ConnectionRefusedError")
    tcp = lab.attack(f"result = socket.create_connection(({HOST!r}, 53), timeout=10)")
    _refused_fast(tcp, "ConnectionRefusedError")
    assert len([n for n in lab.dns.names if not n.endswith(".in-addr.arpa")]) == asked
    assert {(53, "udp"), (53, "tcp")} <= {(d.port, d.protocol) for d in lab.denials(since)}


def test_dns_tunnelling_through_the_runs_resolver_gets_no_answer_and_goes_nowhere(
    lab: Lab,
) -> None:
    """Names looked up with the container's own resolver (Docker's, which asks the gateway)
    are answered NXDOMAIN at once and never leave: our DNS server sees none of them. Each
    lookup is reported."""

    def forward() -> list[str]:  # (the gateway's reverse lookups of its clients aside)
        return [n for n in lab.dns.names if not n.endswith(".in-addr.arpa")]

    asked = len(forward())
    since = time.time()
    secret = uuid.uuid4().hex
    for name in (f"{secret}.tunnel.test", "allowed.test", "forbidden.test"):
        outcome = lab.attack(f"result = socket.getaddrinfo({name!r}, 443)")
        _refused_fast(outcome, "gaierror")
    through_proxy = lab.attack(_proxy_get(f"http://{secret}.tunnel.test:443/"))
    _refused_fast(through_proxy, "HTTPError")
    assert len(forward()) == asked  # the gateway resolved nothing for them either
    looked_up = {d.host for d in lab.denials(since) if d.protocol == "dns"}
    assert f"{secret}.tunnel.test" in looked_up


def test_a_harness_cannot_forge_a_network_denial() -> None:
    """The ``network`` kind is the worker's alone: a stdio-json harness claiming it gets
    ``other`` (the vendor adapters never produce it)."""
    from adapters import stdio_json
    from adapters.protocol import TurnRequest

    line = {"type": "activity", "kind": "network", "description": "denied evil:1"}
    state = stdio_json.new_state(TurnRequest(input="x", turn=1, workspace="/w", home="/h"))
    (event,) = stdio_json.map_message(line, state)
    assert event.kind == "other"


def test_the_gateway_container_is_hardened(lab: Lab) -> None:
    client = docker.from_env()
    info = client.api.inspect_container(lab.config.container_name)
    host = info["HostConfig"]
    assert not host["Privileged"]
    assert host["CapDrop"] == ["ALL"]
    assert set(host["CapAdd"]) <= {"NET_ADMIN", "SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "KILL"}
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] and not host["Binds"] and not info["Mounts"]
    assert set(info["NetworkSettings"]["Networks"]) == {lab.config.network_name, "bridge"}
    network = client.api.inspect_network(lab.config.network_name)
    assert network["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    assert network["Options"]["com.docker.network.bridge.enable_ip_masquerade"] == "false"


def test_the_runs_container_is_only_on_the_egress_network(lab: Lab) -> None:
    lab.container.reload()
    networks = lab.container.attrs["NetworkSettings"]["Networks"]
    assert set(networks) == {lab.config.network_name}
    assert lab.container.attrs["HostConfig"]["Dns"] == [lab.config.router_ip]
    assert container_name(lab.run_id) == lab.container.name
    env = dict(e.split("=", 1) for e in lab.container.attrs["Config"]["Env"])
    assert env["HTTPS_PROXY"] == lab.config.proxy_url


def test_doctor_checks_the_gateway(lab: Lab) -> None:
    from config.settings import load_settings
    from worker.cli.doctor import egress_check

    settings = load_settings(
        key_prefix=lab.config.scope,
        network="egress",
        egress_subnet=SUBNET,
        egress_resolvers=",".join(lab.config.resolvers),
        egress_hosts="allowed.test=172.17.0.1",
    )
    check = egress_check(settings)
    assert check.ok, check
    assert lab.config.proxy_url in check.detail and "claude-code: api.anthropic.com:443" in (
        check.detail
    )


def test_the_reaper_replaces_a_stopped_gateway_and_the_runs_rules_come_back(lab: Lab) -> None:
    port = lab.allowed.server_address[1]
    gateway = docker.from_env().containers.get(lab.config.container_name)
    gateway.stop(timeout=1)
    down = lab.attack(_proxy_get(f"http://allowed.test:{port}/"))
    assert not down["ok"], down  # no gateway: nothing gets out (after ARP gives up, ~3 s)
    done = lab.sandbox.reap_gateway()
    assert done == "replaced the stopped egress gateway (1 egress runs)"
    assert lab.sandbox.reap_gateway() is None  # healthy now: left alone
    back = lab.attack(_proxy_get(f"http://allowed.test:{port}/"))
    assert back["ok"] and "allowed-server-reply" in back["result"], back
