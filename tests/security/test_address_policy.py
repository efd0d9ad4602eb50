"""Which addresses a named host may be reached at (sandbox/addresses.py), and that a host is
reached at exactly the address it was checked at (DNS rebinding).

The policy cases go through the checks producers and tenants meet (``check_repo_url`` for a
``--repo`` and, through it, a webhook URL): each address below was let through before, by a
check built on ``ipaddress.is_global`` that unwrapped only the IPv4-mapped form.

Rebinding cannot be produced for real here (no resolver of ours answers on these machines):
``socket.getaddrinfo`` is replaced by one that answers a public address first and loopback
after, as a rebinding DNS server does. What is shown is that one lookup is made, and that
the connection goes to the address it answered: git's (pinned with ``http.curloptResolve``,
against a real git server) and the webhook client's (its connection recorded, and, over TLS
against a real server, the name kept for SNI and certificate verification).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from config import load_settings
from sandbox import addresses
from sandbox.store.seeding import RepoAddress, SeedError, check_repo_url, seed_from_repo
from sandbox.store.snapshots import SnapshotStore
from tests.gitserver import git_server
from tests.unit.sandbox_snapshots.git_fixtures import GID, UID, git
from worker.api import webhooks
from worker.api.outbound import webhook_client
from worker.errors import InvalidInput

PUBLIC = "93.184.216.34"
"""A globally routable address (never connected to: these tests record the attempt)."""

REFUSED = [
    ("::127.0.0.1", "IPv4-compatible loopback"),
    ("::ffff:0:7f00:1", "IPv4-translated loopback"),
    ("64:ff9b::a9fe:a9fe", "NAT64 form of the metadata address"),
    ("64:ff9b::7f00:1", "NAT64 form of loopback"),
    ("64:ff9b:1::a9fe:a9fe", "local-use NAT64 prefix"),
    ("2002:a9fe:a9fe::1", "6to4 form of the metadata address"),
    ("2002:7f00:1::1", "6to4 form of loopback"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ("fec0::1", "site-local"),
    ("ff0e::1", "global-scope multicast"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast (SSDP)"),
    ("192.0.2.1", "documentation"),
    ("3fff::1", "documentation (IPv6)"),
    ("4000::1", "reserved IPv6, outside 2000::/3"),
    ("::ffff:169.254.169.254", "IPv4-mapped metadata address"),
    ("169.254.169.254", "metadata address"),
    ("127.0.0.1", "loopback"),
    ("::1", "IPv6 loopback"),
    ("fd00:ec2::254", "unique-local (the IPv6 metadata address)"),
    ("fe80::1%lo", "link-local with a zone"),
    ("100.64.0.1", "shared address space"),
    ("0.0.0.0", "this network"),
    ("255.255.255.255", "broadcast"),
]
PUBLIC_FORMS = [
    "8.8.8.8",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
]


def resolver(*answers: str) -> Callable[..., list[Any]]:
    """A ``getaddrinfo`` answering ``answers`` in turn (the last one again after that), for
    every name but loopback's; it counts its calls in ``.calls``."""
    real = socket.getaddrinfo
    calls: list[str] = []

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host in ("localhost", "127.0.0.1", "::1"):
            return real(host, port, *args, **kwargs)
        calls.append(str(host))
        text = answers[min(len(calls), len(answers)) - 1]
        address = addresses.parse(text)
        port_number = int(port or 0)
        if address.version == 4:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (text, port_number))]
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, port_number, 0, 0))]

    fake.calls = calls  # type: ignore[attr-defined]
    return fake


# -- the policy ------------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "what"), REFUSED)
def test_a_host_resolving_to_a_non_public_form_is_refused(
    monkeypatch: pytest.MonkeyPatch, address: str, what: str
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", resolver(address))
    with pytest.raises(SeedError, match="non-public address"):
        check_repo_url("https://repo.example.com/r.git", {"https"}, {"*"})
    settings = load_settings(webhook_schemes=("https",), webhook_hosts=("*",))
    with pytest.raises(InvalidInput, match="webhook_url refused"):
        webhooks.check_url("https://hook.example.com/in", settings)


@pytest.mark.parametrize(("address", "what"), [r for r in REFUSED if "%" not in r[0]])
def test_an_ip_literal_in_a_non_public_form_is_refused(address: str, what: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(SeedError, match="non-public address"):
        check_repo_url(f"https://{host}/r.git", {"https"}, {"*"})


@pytest.mark.parametrize("address", PUBLIC_FORMS)
def test_public_addresses_and_forms_carrying_one_are_allowed(address: str) -> None:
    assert addresses.is_public(address)
    host = f"[{address}]" if ":" in address else address
    assert check_repo_url(f"https://{host}/r.git", {"https"}, {"*"}) == RepoAddress()


def test_the_refusal_names_the_ipv4_address_a_form_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", resolver("64:ff9b::a9fe:a9fe"))
    with pytest.raises(SeedError, match=r"NAT64 169\.254\.169\.254"):
        check_repo_url("https://repo.example.com/r.git", {"https"}, {"*"})


def test_one_private_answer_among_public_ones_refuses_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def both(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host == "repo.example.com":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, 443)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:0:7f00:1", 443, 0, 0)),
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", both)
    with pytest.raises(SeedError, match=r"IPv4-translated 127\.0\.0\.1"):
        check_repo_url("https://repo.example.com/r.git", {"https"}, {"*"})


def test_the_gateways_refused_networks_are_exactly_what_the_policy_refuses() -> None:
    """The egress gateway (squid) takes networks, not a function: those it is given refuse
    exactly the addresses is_public refuses, embedded forms included."""
    networks = [ipaddress.ip_network(n) for n in addresses.refused_networks()]
    rng = random.Random(36)
    samples: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [
        addresses.parse(a) for a, _ in REFUSED
    ]
    samples += [addresses.parse(a) for a in PUBLIC_FORMS]
    for _ in range(20000):
        samples.append(ipaddress.IPv4Address(rng.getrandbits(32)))
        samples.append(ipaddress.IPv6Address(rng.getrandbits(128)))
        v4 = rng.getrandbits(32)
        carrier = rng.choice([0xFFFF << 32, 0xFFFF << 48, 0, 0x64FF9B << 96])
        samples.append(ipaddress.IPv6Address(carrier | v4))
        samples.append(ipaddress.IPv6Address(0x2002 << 112 | v4 << 80 | rng.getrandbits(80)))
    for address in samples:
        refused = any(address in network for network in networks)
        assert refused is not addresses.is_public(address), address


# -- git: one lookup, and the clone goes to its answer --------------------------------------


def test_a_repo_host_is_resolved_once_and_git_is_held_to_that_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = resolver(PUBLIC, "127.0.0.1")  # public when checked, loopback when asked again
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    address = check_repo_url("https://rebind.example.com/r.git", {"https"}, {"*"})
    assert fake.calls == ["rebind.example.com"]  # type: ignore[attr-defined]
    assert address.addresses == (PUBLIC,)
    assert address.git_config() == (("http.curloptResolve", f"rebind.example.com:443:{PUBLIC}"),)


def test_git_connects_to_the_pinned_address_not_to_its_own_lookup(tmp_path: Path) -> None:
    """``rebind.invalid`` resolves nowhere (RFC 6761): the seed succeeds only because git
    connects to the address it was given, and looks nothing up."""
    with git_server(tmp_path / "repos") as server:
        commit = server.create("seed.git", {"README.md": "pinned\n"})
        url = f"http://rebind.invalid:{server.port}/seed.git"
        workspace = tmp_path / "root" / "run" / "r1"
        workspace.mkdir(parents=True)
        pinned = RepoAddress("rebind.invalid", server.port, ("127.0.0.1",))
        store = SnapshotStore(tmp_path / "root", "r1")
        seed_from_repo(store, workspace, url, None, {}, UID, GID, 60, address=pinned)
        assert git(workspace, "rev-parse", "HEAD") == commit
        assert (workspace / "README.md").read_text() == "pinned\n"
        # The same, held to an address where nothing listens: git does not look elsewhere.
        other = tmp_path / "root" / "run" / "r2"
        other.mkdir(parents=True)
        nowhere = RepoAddress("rebind.invalid", server.port, ("127.0.0.3",))
        with pytest.raises(SeedError, match=r"connect"):
            seed_from_repo(
                SnapshotStore(tmp_path / "root", "r2"),
                other,
                url,
                None,
                {},
                UID,
                GID,
                30,
                address=nowhere,
            )


# -- webhooks: one lookup, the connection to its answer, the name kept for TLS -------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where the webhook client's connections go (none is made: each is refused after it
    is recorded)."""
    seen: list[str] = []

    async def record(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(host)
        raise httpcore.ConnectError("recorded, not connected")

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", record)
    return seen


def post(url: str, named: tuple[str, ...], verify: ssl.SSLContext | bool = True) -> int:
    """POST through the API's webhook client; the reply's status."""

    async def send() -> int:
        async with webhook_client(named, connections=4, verify=verify) as http:
            return (await http.post(url, content=b"{}")).status_code

    return asyncio.run(send())


def test_a_webhook_host_is_resolved_once_and_connected_at_that_answer(
    monkeypatch: pytest.MonkeyPatch, connects: list[str]
) -> None:
    fake = resolver(PUBLIC, "127.0.0.1")
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(httpx.ConnectError):
        post("https://rebind.example.com/hook", ("*",))
    assert fake.calls == ["rebind.example.com"]  # type: ignore[attr-defined]
    assert connects == [PUBLIC]


def test_a_webhook_host_that_now_resolves_private_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch, connects: list[str]
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", resolver("64:ff9b::a9fe:a9fe"))
    with pytest.raises(addresses.AddressRefused, match=r"NAT64 169\.254\.169\.254"):
        post("https://rebind.example.com/hook", ("*",))
    assert connects == []


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext, list[tuple[str, str]]]]:
    """An HTTPS server on 127.0.0.1 whose certificate names ``hook.invalid`` only; it
    records (SNI, Host) of each request. Yields its port, a client context trusting its
    certificate, and the records."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=hook.invalid", "-addext", "subjectAltName=DNS:hook.invalid",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    seen: list[tuple[str, str]] = []
    sni: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            seen.append((sni[-1] if sni else "", self.headers["host"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    server_context.sni_callback = lambda _sock, name, _ctx: sni.append(name or "")  # type: ignore[assignment,misc]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cafile=str(cert))
    yield server.server_address[1], client_context, seen
    server.shutdown()
    server.server_close()


def test_a_pinned_webhook_keeps_the_name_for_host_sni_and_the_certificate(
    monkeypatch: pytest.MonkeyPatch,
    tls_receiver: tuple[int, ssl.SSLContext, list[tuple[str, str]]],
) -> None:
    """Both names resolve to the receiver (the operator names them: loopback); the
    connection goes to the address, TLS to the name: the certificate for ``hook.invalid``
    is accepted for it and refused for ``other.invalid`` at the same address."""
    port, context, seen = tls_receiver
    monkeypatch.setattr(socket, "getaddrinfo", resolver("127.0.0.1"))
    named = ("hook.invalid", "other.invalid")
    assert post(f"https://hook.invalid:{port}/in", named, context) == 204
    with pytest.raises(httpx.ConnectError, match=r"certificate|hostname|match"):
        post(f"https://other.invalid:{port}/in", named, context)
    assert seen == [("hook.invalid", f"hook.invalid:{port}")]
