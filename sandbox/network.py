"""What a run may reach over the network, as operator policy states it: the model the worker
and the backends share, pure (no Docker SDK; the producer's client imports it).

- Network ``egress``: :class:`EgressConfig`, the allowlist of ``host:port`` pairs
  (:class:`Endpoint`) per harness, and the labels that name a run's allowlist on its
  container (:func:`egress_labels`). The Docker backend's gateway applies it
  (:mod:`sandbox.docker.egress`, :mod:`sandbox.docker.gateway`).
- Network ``bridge``: :class:`BridgeConfig`, a network of ours whose runs reach neither each
  other, nor the host, nor a private, loopback or link-local address (cloud metadata
  included) unless the operator lists it (:class:`Destination`). The Docker backend's guard
  applies it (:mod:`sandbox.docker.isolation`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GATEWAY_IMAGE = "harness-worker/gateway:1"
"""The egress gateway's image; it also holds the iptables the bridge guard runs."""
LABEL_HARNESS = "harness.egress_harness"
"""On a run's container: its harness, whose allowlist (operator policy) the gateway applies."""
LABEL_BASE_URL = "harness.egress_base_url"
"""On a run's container: the ``host:port`` of its producer's ``--base-url`` (may be empty),
allowed when policy allows producer endpoints."""

_NAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


@dataclass(frozen=True, order=True)
class Endpoint:
    """One allowed destination: a host name (or an IP literal) and a port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """``host:port`` (``[v6]:port`` for an IPv6 literal); the port is required.

        Raises ``ValueError`` for anything else: a malformed setting or option (the caller's
        to report as such), not a sandbox fault, so not of the ``SandboxError`` tree."""
        value = text.strip()
        host, sep, port_text = value.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"egress endpoint {value[:80]!r} needs a port: use host:port")
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(f"egress endpoint {value[:80]!r}: port out of range")
        host = host.strip("[]").lower().rstrip(".")
        if not is_ip(host) and not _NAME.match(host):
            raise ValueError(f"egress endpoint {value[:80]!r}: not a host name or an IP address")
        return cls(host, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated list of ``host:port`` (empty text: none), sorted, without repeats."""
    return tuple(sorted({Endpoint.parse(p) for p in text.split(",") if p.strip()}))


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class EgressConfig:
    """The operator's egress settings for one Docker host (from ``HARNESS_EGRESS_*``)."""

    scope: str = "default"
    network: str = "harness-egress"
    """The Docker network of egress runs (suffixed with the scope)."""
    subnet: str = "172.30.240.0/24"
    """Its subnet: ``.1`` is the gateway's route address, ``.2`` its own."""
    outside_network: str = "bridge"
    """The network through which the gateway reaches allowed hosts."""
    image: str = GATEWAY_IMAGE
    port: int = 3128
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Names pinned to addresses (the gateway's hosts file). A pinned name may be private."""
    resolvers: tuple[str, ...] = ()
    """DNS servers the gateway uses for names it resolves; empty: the gateway's own."""
    memory: str = "256m"
    allow: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """Per harness, the endpoints its runs may reach (operator policy)."""
    allow_base_url: bool = False
    """Whether a run's producer-supplied base URL endpoint is allowed too."""

    def allowlist(self, harness: str, base_url: str | None = None) -> tuple[Endpoint, ...]:
        """What a run of ``harness`` may reach: its harness's endpoints, plus the endpoint of
        its base URL (``host:port``) when policy allows producer endpoints."""
        endpoints = set(self.allow.get(harness, ()))
        if base_url and self.allow_base_url:
            endpoints.add(Endpoint.parse(base_url))
        return tuple(sorted(endpoints))

    @property
    def network_name(self) -> str:
        return f"{self.network}-{self.scope}"

    @property
    def container_name(self) -> str:
        return f"harness-egress-gateway-{self.scope}"

    @property
    def router_ip(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def inside_ip(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[2])

    @property
    def proxy_url(self) -> str:
        return f"http://{self.router_ip}:{self.port}"

    def fingerprint(self) -> str:
        """What the gateway container is created from (not the allowlists: those reload)."""
        text = repr(
            (self.subnet, self.outside_network, self.image, self.port, self.memory, self.resolvers)
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def egress_labels(harness: str, base_url: str | None) -> dict[str, str]:
    """The labels of an egress run's container that name its allowlist: its harness's, and
    its base URL's endpoint (allowed when policy allows producer endpoints)."""
    return {LABEL_HARNESS: harness, LABEL_BASE_URL: base_url_endpoint(base_url) or ""}


def base_url_endpoint(url: str | None) -> str | None:
    """``host:port`` of a base URL (the scheme's port when none is given), or None."""
    if not url:
        return None
    scheme, sep, _ = url.partition("://")
    if not sep:
        return None
    host, port = split_target(url, "GET")
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme.lower())
    if not host or port is None:
        return None
    return str(Endpoint(host, port))


def split_target(url: str, method: str) -> tuple[str, int | None]:
    """Host and port of a request line's target: ``host:port`` (CONNECT) or an absolute URL."""
    rest = url
    default = 443 if method == "CONNECT" else None
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        default = {"http": 80, "https": 443}.get(scheme.lower(), default)
        rest = rest.split("/", 1)[0]
    rest = rest.rsplit("@", 1)[-1]
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail.lstrip(":")
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            host, port_text = rest, ""
    port = int(port_text) if port_text.isdigit() else default
    return host.lower(), port


# -- network bridge ------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Destination:
    """An IPv4 address or network, on one TCP port or every port, that runs on network
    ``bridge`` may reach although it is private or the host's own (``HARNESS_BRIDGE_ALLOW``)."""

    network: ipaddress.IPv4Network
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Destination:
        """``ADDRESS[/PREFIX][:PORT]`` (IPv4); ``ValueError`` for anything else."""
        value = text.strip()
        address, sep, port_text = value.partition(":")
        port = None
        if sep:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"bridge destination {value[:80]!r}: the port is not 1-65535")
            port = int(port_text)
        try:
            network = ipaddress.IPv4Network(address, strict=False)
        except ValueError:
            raise ValueError(
                f"bridge destination {value[:80]!r}: expected an IPv4 ADDRESS[/PREFIX][:PORT]"
            ) from None
        return cls(network, port)

    def __str__(self) -> str:
        net = (
            str(self.network.network_address) if self.network.prefixlen == 32 else str(self.network)
        )
        return net if self.port is None else f"{net}:{self.port}"


@dataclass(frozen=True)
class BridgeConfig:
    """The operator's settings for network ``bridge`` on one Docker host (``HARNESS_BRIDGE_*``).

    ``isolate``: runs join :attr:`network_name`, a bridge of ours without inter-container
    traffic, whose runs the host refuses (but for :attr:`allow`) and which reaches no
    private, loopback or link-local address (but for :attr:`allow`); the internet is
    reached as on Docker's own bridge. Not ``isolate``: runs join Docker's default
    ``bridge``, where they reach each other and the host's services.

    One network per Docker host and allowlist, whatever the deployment: runs on it reach one
    another no more than runs on two networks would, and deployments sharing a host (tests,
    say) make one network, not one each.
    """

    isolate: bool = True
    allow: tuple[Destination, ...] = ()
    """Private or host destinations runs may still reach (a model proxy, say)."""
    guard_image: str = GATEWAY_IMAGE
    """The image whose iptables installs the host's rules (the egress gateway's)."""

    @property
    def allowlist(self) -> str:
        """:attr:`allow` as one text (the network's label): ``-`` for nothing."""
        return ",".join(str(d) for d in sorted(set(self.allow))) or "-"

    @property
    def network_name(self) -> str:
        """The Docker network runs on ``bridge`` join (Docker's own when not isolated)."""
        if not self.isolate:
            return "bridge"
        if not self.allow:
            return "harness-runs"
        return f"harness-runs-{hashlib.sha256(self.allowlist.encode()).hexdigest()[:10]}"
