"""The ``egress`` network mode: a run reaches the hosts its allowlist names, and nothing else.

One gateway per Docker host and scope, shared by every egress run there:

- **The egress network** is a Docker bridge with ``inhibit_ipv4`` (the host has no address on
  it, so a run cannot reach the host's own ports: Redis, the worker's metrics, a Docker TCP
  socket) and no masquerading. Its gateway address (``.1``) is taken by the gateway container
  itself, so a run's default route leads into the gateway and nowhere else (a run has no raw
  sockets to address anything else on the wire).
- **The gateway container** (``harness-worker/gateway:1``, built from Debian packages by
  ``scripts/build-images``, see ``docker/gateway/``) sits on that network and on an outside one
  (``bridge`` by default). ``squid`` is an HTTP CONNECT proxy there, the only way out: it
  allows a client address (a run's container) the ``host:port`` pairs of that run's allowlist,
  resolves names itself and refuses any that resolves to a private, loopback or link-local
  address unless operator policy pins that name to an address. Everything else that reaches
  the gateway (a client that ignores its proxy variables, a raw IP, DNS to another resolver,
  UDP/QUIC) is rejected at once by ``iptables`` (a TCP reset or an ICMP error: it fails fast)
  and reported by ``ulogd`` (NFLOG); ``dnsmasq`` answers the runs' lookups NXDOMAIN and logs
  them. Squid's management interface is refused to everyone.
- **Runs** get ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and lower-case twins) naming the
  gateway, their DNS pointed at it, and labels naming their harness and base URL endpoint;
  their allowlist is the operator's policy for those (:meth:`EgressConfig.allowlist`). After a
  run's container starts or goes, the gateway's squid configuration is rendered again from the
  live runs and reloaded (``squid -k reconfigure``: tunnels in flight are kept).
- **Denials** are read back from the gateway's log for one client address and time window
  (:func:`parse_denial`): squid's ``TCP_DENIED`` lines, rejected packets, DNS queries.

This module is the model (policy, squid's configuration, the parsing of its log), pure and
without the Docker SDK (the producer's client imports it); the gateway on a Docker host is
:mod:`sandbox.docker.gateway`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sandbox.base import Denial

GATEWAY_IMAGE = "harness-worker/gateway:1"
LABEL_GATEWAY = "harness.egress_gateway"
"""On the gateway container: the scope it serves."""
LABEL_HARNESS = "harness.egress_harness"
"""On a run's container: its harness, whose allowlist (operator policy) the gateway applies."""
LABEL_BASE_URL = "harness.egress_base_url"
"""On a run's container: the ``host:port`` of its producer's ``--base-url`` (may be empty),
allowed when policy allows producer endpoints."""
LABEL_CONFIG = "harness.egress_config"
"""On the gateway container: a hash of the settings it was created with (a change recreates it)."""
BUILD_HINT = "run scripts/build-images --only gateway to build the egress gateway image"

PRIVATE_RANGES: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/127",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)
"""Destinations the gateway refuses unless policy pins the name to them (RFC 6890 ranges:
private, loopback, link-local (cloud metadata), shared, multicast, reserved)."""

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
        if not _is_ip(host) and not _NAME.match(host):
            raise ValueError(f"egress endpoint {value[:80]!r}: not a host name or an IP address")
        return cls(host, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated list of ``host:port`` (empty text: none), sorted, without repeats."""
    return tuple(sorted({Endpoint.parse(p) for p in text.split(",") if p.strip()}))


def _is_ip(text: str) -> bool:
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


def base_url_endpoint(url: str | None) -> str | None:
    """``host:port`` of a base URL (the scheme's port when none is given), or None."""
    if not url:
        return None
    scheme, sep, _ = url.partition("://")
    if not sep:
        return None
    host, port = _split_target(url, "GET")
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme.lower())
    if not host or port is None:
        return None
    return str(Endpoint(host, port))


def proxy_environment(config: EgressConfig) -> dict[str, str]:
    """The variables that send a run's clients through the gateway. ``NO_PROXY`` keeps
    loopback local (a dev server inside the container); clearing any of these only makes a
    client try a direct connection, which the gateway rejects."""
    url = config.proxy_url
    return {
        "HTTPS_PROXY": url,
        "HTTP_PROXY": url,
        "https_proxy": url,
        "http_proxy": url,
        "ALL_PROXY": url,
        "all_proxy": url,
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
        # Node 24+ honours the variables above only when asked (node 20 ignores this).
        "NODE_USE_ENV_PROXY": "1",
    }


# -- squid's configuration ---------------------------------------------------------------------


def render_squid_conf(config: EgressConfig, clients: Mapping[str, Iterable[Endpoint]]) -> str:
    """squid.conf for the gateway: ``clients`` maps a run container's address to its allowlist.

    Order of ``http_access``: the management interface is refused; a client's allowed
    ``host:port`` is let through when the name is pinned by policy or resolves to a public
    address; everything else is refused with an error page naming the rule.
    """
    lines = [
        "# Generated by sandbox/docker/egress.py from operator policy and the live egress runs.",
        # Only on the egress network's side: containers on the outside network (runs on
        # `bridge`, say) cannot use the gateway as a proxy at all.
        f"http_port {config.router_ip}:{config.port}",
        "pid_filename /run/gateway/squid.pid",
        "cache_effective_user proxy",
        "cache deny all",
        "cache_mem 4 MB",
        "memory_pools off",
        "pinger_enable off",
        "via off",
        "forwarded_for delete",
        "httpd_suppress_version_string on",
        "shutdown_lifetime 1 seconds",
        "logfile_rotate 0",
        "logformat harness harness-access %ts.%03tu %>a %rm %ru %>Hs %Ss %err_code",
        "access_log stdio:/run/gateway/access.log harness",
        "buffered_logs off",
        "cache_log /run/gateway/cache.log",
        "cache_store_log none",
        "coredump_dir /tmp",
        "error_directory /usr/share/squid/harness-errors",
        "hosts_file /run/gateway/hosts",
        "connect_timeout 10 seconds",
        "dns_timeout 5 seconds",
        "negative_dns_ttl 1 seconds",
        # A request for a name that cannot be resolved ends at once, not after retries.
        "dns_retransmit_interval 1 seconds",
    ]
    if config.resolvers:
        lines.append("dns_nameservers " + " ".join(config.resolvers))
    lines += [
        "acl CONNECT method CONNECT",
        f"acl to_private dst {' '.join(PRIVATE_RANGES)}",
        "http_access deny manager",
        "deny_info ERR_HARNESS_ADMIN manager",
    ]
    pinned = sorted(config.hosts)
    if pinned:
        lines.append(f"acl pinned dstdomain -n {' '.join(pinned)}")
    groups: dict[tuple[Endpoint, ...], list[str]] = {}
    for address, endpoints in sorted(clients.items()):
        allowed = tuple(sorted(set(endpoints)))
        if allowed:
            groups.setdefault(allowed, []).append(address)
    for index, (allowed, addresses) in enumerate(sorted(groups.items())):
        lines.append(f"acl g{index} src {' '.join(addresses)}")
        by_port: dict[int, list[str]] = {}
        for endpoint in allowed:
            by_port.setdefault(endpoint.port, []).append(endpoint.host)
        for port, hosts in sorted(by_port.items()):
            acl = f"g{index}p{port}"
            lines.append(f"acl {acl}_port port {port}")
            names = [h for h in hosts if not _is_ip(h)]
            ips = [h for h in hosts if _is_ip(h)]
            if names:
                lines.append(f"acl {acl}_name dstdomain -n {' '.join(sorted(names))}")
                # An allowed name that resolves to a private address is refused, unless
                # policy pins it (deny_info names the rule by the line's last ACL).
                unpinned = " !pinned" if pinned else ""
                lines.append(
                    f"http_access deny g{index} {acl}_port {acl}_name{unpinned} to_private"
                )
                lines.append(f"http_access allow g{index} {acl}_port {acl}_name")
            if ips:
                # An IP literal in an allowlist is the operator's explicit choice.
                lines.append(f"acl {acl}_ip dst {' '.join(sorted(ips))}")
                lines.append(f"acl {acl}_ipname dstdomain -n {' '.join(sorted(ips))}")
                lines.append(f"http_access allow g{index} {acl}_port {acl}_ipname {acl}_ip")
    lines += [
        "deny_info ERR_HARNESS_PRIVATE to_private",
        "deny_info ERR_HARNESS_NOT_ALLOWED all",
        "http_access deny all",
        "",
    ]
    return "\n".join(lines)


def render_hosts(config: EgressConfig) -> str:
    return "".join(f"{ip} {name}\n" for name, ip in sorted(config.hosts.items()))


# -- denials, from the gateway's log -----------------------------------------------------------

_RULES = {
    "ERR_HARNESS_NOT_ALLOWED": "not-allowed",
    "ERR_HARNESS_PRIVATE": "private-address",
    "ERR_HARNESS_ADMIN": "admin",
}
_PACKET_FIELD = re.compile(r"\b(SRC|DST|PROTO|DPT)=(\S+)")
_DNS_QUERY = re.compile(r"dnsmasq\[\d+\]: query\[(\w+)\] (\S+) from (\S+)")


def parse_denial(line: str) -> Denial | None:
    """A denial from one line of the gateway's log, or None for any other line.

    Squid (``logformat harness``): ``harness-access TIME CLIENT METHOD URL STATUS TAG ERR``,
    a denial being ``TCP_DENIED``. Ulogd: a LOGEMU line with the ``harness-denied`` prefix
    and ``SRC= DST= PROTO= DPT=`` fields.
    """
    if "harness-access " in line:
        parts = line.split("harness-access ", 1)[1].split()
        if len(parts) < 7 or not parts[5].startswith("TCP_DENIED"):
            return None
        at, client, method, url = parts[0], parts[1], parts[2], parts[3]
        host, port = _split_target(url, method)
        try:
            when: float | None = float(at)
        except ValueError:
            when = None
        return Denial(client, host, port, "http", _RULES.get(parts[6], "not-allowed"), when)
    if "harness-denied" in line:
        fields = dict(_PACKET_FIELD.findall(line))
        if "SRC" not in fields or "DST" not in fields:
            return None
        port = int(fields["DPT"]) if fields.get("DPT", "").isdigit() else None
        protocol = fields.get("PROTO", "ip").lower()
        return Denial(fields["SRC"], fields["DST"], port, protocol, "direct")
    query = _DNS_QUERY.search(line)
    if query:
        return Denial(query.group(3), query.group(2).lower(), 53, "dns", "dns-lookup")
    return None


def _split_target(url: str, method: str) -> tuple[str, int | None]:
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
