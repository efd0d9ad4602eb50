"""The ``egress`` network mode: a run reaches the hosts its allowlist names, and nothing else.

One gateway per Docker host, shared by every egress run of a scope:

- **The egress network** is a Docker bridge created ``internal`` (Docker adds no NAT and drops
  what would be forwarded out of it) with ``inhibit_ipv4`` (the host has no address on it, so a
  run cannot reach the host's own ports: Redis, the worker's metrics, a Docker TCP socket).
  Its gateway address (``.1``) is taken by the gateway container itself, so a run's default
  route leads into the gateway and nowhere else.
- **The gateway container** (``harness-worker/gateway:1``, built from Debian packages by
  ``scripts/build-images``, see ``docker/gateway/``) sits on that network and on an outside one
  (``bridge`` by default). ``squid`` is an HTTP CONNECT proxy there, the only way out: it
  allows a client address (a run's container) the ``host:port`` pairs of that run's allowlist,
  resolves names itself and refuses any that resolves to a private, loopback or link-local
  address unless operator policy pins that name to an address. Everything else that reaches
  the gateway (a client that ignores its proxy variables, a raw IP, DNS to another resolver,
  UDP/QUIC) is rejected at once by ``iptables`` (a TCP reset or an ICMP error: it fails fast)
  and reported by ``ulogd`` (NFLOG). Squid's management interface is refused to everyone.
- **Runs** get ``HTTPS_PROXY``/``HTTP_PROXY`` (and the lower-case twins, ``ALL_PROXY``) naming
  the gateway, their DNS pointed at the gateway (which refuses lookups: names are the proxy's
  to resolve), and a label with their allowlist. After a run's container starts or goes,
  :meth:`Gateway.sync` renders squid's configuration from the labels of the live containers
  on the network and reloads squid (``squid -k reconfigure``: tunnels in flight are kept).
- **Denials** are read back from the gateway's log for one client address and time window
  (:meth:`Gateway.denials`): squid's ``TCP_DENIED`` lines and ulogd's rejected packets.

The pure parts (rendering, parsing) are functions here, tested without Docker.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker.errors

from sandbox.base import SandboxError

log = logging.getLogger(__name__)

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
        """``host:port`` (``[v6]:port`` for an IPv6 literal); the port is required."""
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
        "# Generated by sandbox/egress.py from operator policy and the live egress runs.",
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


@dataclass(frozen=True)
class Denial:
    """One refused connection attempt of a client of the gateway."""

    client: str
    host: str
    port: int | None
    protocol: str
    """``http`` (refused by the proxy), ``tcp``, ``udp``, ``icmp``... (rejected packets)."""
    rule: str
    """Why: ``not-allowed``, ``private-address``, ``admin`` (the proxy), ``direct`` (a
    connection that did not go through the proxy), ``dns-lookup`` (a name looked up: the
    gateway's resolver answers none)."""
    at: float | None = None

    def describe(self) -> str:
        target = f"{self.host}:{self.port}" if self.port is not None else self.host
        if self.protocol == "dns":
            return f"denied dns lookup of {self.host} ({self.rule})"
        how = "through the proxy" if self.protocol == "http" else f"direct {self.protocol}"
        return f"denied {how} {target} ({self.rule})"


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


# -- the gateway on a Docker host --------------------------------------------------------------


class Gateway:
    """The egress network and gateway container of one scope on one Docker daemon.

    ``client`` returns a docker SDK client; ``seam`` translates Docker's errors (as in
    :mod:`sandbox.docker`). Thread-safe; several workers on one daemon may call it at once
    (creation conflicts are resolved by name, reloads converge: see :meth:`sync`).
    """

    def __init__(self, config: EgressConfig, client: Callable[[], Any], seam: Any) -> None:
        self.config = config
        self._client = client
        self._seam = seam
        self._lock = threading.Lock()
        self._ready = False
        self._pushed = ""

    @property
    def started(self) -> bool:
        """Whether this process has started (or found) the gateway."""
        return self._ready

    # -- lifecycle ----------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the egress network and start the gateway when either is missing (or the
        gateway is stopped, or was created from other settings); idempotent."""
        with self._lock:
            if self._ready and self._running():
                return
            with self._seam("start the egress gateway"):
                self._ensure_network()
                self._ensure_container()
            self._ready = True
            self._pushed = ""
        self.sync()

    def _running(self) -> bool:
        try:
            container = self._client().containers.get(self.config.container_name)
        except docker.errors.NotFound:
            return False
        return bool(container.status == "running")

    def _ensure_network(self) -> None:
        client = self._client()
        name = self.config.network_name
        pool = docker.types.IPAMPool(subnet=self.config.subnet, gateway=self.config.router_ip)
        failure: docker.errors.APIError | None = None
        for _ in range(20):
            try:
                client.networks.get(name)
                return
            except docker.errors.NotFound:
                pass
            try:
                client.networks.create(
                    name,
                    driver="bridge",
                    # Not ``internal``: with bridge-nf-call-iptables (Docker's default), an
                    # internal network's isolation rules drop the runs' packets to the
                    # gateway too (silently: a connection would hang instead of being
                    # refused). The host has no address on this bridge and neither NAT nor a
                    # route to it, so a run without raw sockets can only send through the
                    # gateway (its default route).
                    internal=False,
                    ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                    options={
                        # No host address on the bridge: a run cannot reach the host's ports.
                        "com.docker.network.bridge.inhibit_ipv4": "true",
                        "com.docker.network.bridge.enable_icc": "true",
                        "com.docker.network.bridge.enable_ip_masquerade": "false",
                    },
                    labels={LABEL_GATEWAY: self.config.scope},
                    check_duplicate=True,
                )
                return
            except docker.errors.APIError as exc:
                # Another worker is creating it (Docker says 403 or 409 until it exists), or
                # the subnet is taken by another network (HARNESS_EGRESS_SUBNET).
                failure = exc
                time.sleep(0.25)
        assert failure is not None
        raise SandboxError(
            f"cannot create the egress network {name} ({self.config.subnet}): "
            f"{failure.explanation or failure}",
            hint="give each deployment on this Docker host its own HARNESS_EGRESS_SUBNET",
        )

    def _ensure_container(self) -> None:
        client = self._client()
        name = self.config.container_name
        fingerprint = self.config.fingerprint()
        try:
            existing = client.containers.get(name)
        except docker.errors.NotFound:
            existing = None
        if existing is not None:
            same = (existing.labels or {}).get(LABEL_CONFIG) == fingerprint
            if same and existing.status == "running":
                return
            if same and existing.status == "created":
                # Another worker made it and is about to start it: wait, as that worker does.
                self._wait_healthy(existing, timeout=30.0)
                return
            log.info(
                "egress.gateway_recreated",
                extra={"container": existing.id, "status": existing.status, "same": same},
            )
            existing.remove(force=True)
        try:
            client.images.get(self.config.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"the egress gateway image {self.config.image} is not on this Docker host",
                hint=BUILD_HINT,
            ) from None
        conf = render_squid_conf(self.config, {})
        networking = client.api.create_networking_config(
            {
                self.config.network_name: client.api.create_endpoint_config(
                    ipv4_address=self.config.inside_ip
                )
            }
        )
        try:
            created = client.api.create_container(
                self.config.image,
                name=name,
                labels={LABEL_GATEWAY: self.config.scope, LABEL_CONFIG: fingerprint},
                environment={
                    "HARNESS_GATEWAY_INSIDE_IP": self.config.inside_ip,
                    "HARNESS_GATEWAY_ROUTER": (
                        f"{self.config.router_ip}/{ipaddress.ip_network(self.config.subnet).prefixlen}"
                    ),
                    "HARNESS_GATEWAY_PORT": str(self.config.port),
                    "HARNESS_GATEWAY_CONF": _b64(conf),
                    "HARNESS_GATEWAY_HOSTS": _b64(render_hosts(self.config)),
                },
                networking_config=networking,
                healthcheck={
                    "test": ["CMD", "/usr/local/bin/harness-gateway", "check"],
                    "interval": 5_000_000_000,
                    "timeout": 5_000_000_000,
                    "retries": 3,
                    "start_period": 5_000_000_000,
                },
                host_config=client.api.create_host_config(**self._hardened()),
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
            # Another worker is making it: wait until it serves, as that worker does.
            self._wait_healthy(client.containers.get(name), timeout=30.0)
            return
        container = client.containers.get(created["Id"])
        client.networks.get(self.config.outside_network).connect(container)
        container.start()
        self._wait_healthy(container)
        log.info("egress.gateway_started", extra={"container": container.id})

    def _hardened(self) -> dict[str, Any]:
        """The gateway runs as root in its own network namespace: it needs NET_ADMIN there
        (its route address, its iptables rules), SETUID/SETGID (squid drops to ``proxy``)
        and nothing else. Read-only root; its files live in tmpfs."""
        return {
            "cap_drop": ["ALL"],
            "cap_add": ["NET_ADMIN", "SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "KILL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                "/run": "rw,nosuid,nodev",
                "/tmp": "rw,nosuid,nodev",
                "/var/spool/squid": "rw",
                "/var/log/squid": "rw",
            },
            "sysctls": {"net.ipv4.ip_forward": "1"},
            "mem_limit": self.config.memory,
            "pids_limit": 256,
            "restart_policy": {"Name": "unless-stopped"},
            # Its log is where denials are read back from: bounded, whatever the daemon's
            # default (json-file keeps everything otherwise).
            "log_config": docker.types.LogConfig(
                type="json-file", config={"max-size": "20m", "max-file": "3"}
            ),
        }

    def _wait_healthy(self, container: Any, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            container.reload()
            if container.status == "running":
                code, _ = container.exec_run(["/usr/local/bin/harness-gateway", "check"])
                if code == 0:
                    return
            elif container.status != "created":  # (created: its maker has yet to start it)
                break
            time.sleep(0.2)
        tail = container.logs(tail=20).decode("utf-8", "replace")
        raise SandboxError(f"the egress gateway did not become ready: {tail.strip()[-800:]}")

    # -- configuration --------------------------------------------------------------------

    def clients(self) -> dict[str, tuple[Endpoint, ...]]:
        """The live egress runs: container address on the egress network → allowlist."""
        client = self._client()
        found: dict[str, tuple[Endpoint, ...]] = {}
        for container in client.containers.list(
            filters={"network": self.config.network_name, "label": LABEL_HARNESS}
        ):
            settings = container.attrs.get("NetworkSettings", {}).get("Networks", {})
            address = (settings.get(self.config.network_name) or {}).get("IPAddress")
            if address:
                labels = container.labels or {}
                try:
                    found[address] = self.config.allowlist(
                        labels.get(LABEL_HARNESS, ""), labels.get(LABEL_BASE_URL) or None
                    )
                except ValueError:
                    found[address] = self.config.allowlist(labels.get(LABEL_HARNESS, ""))
        return found

    def sync(self) -> None:
        """Render squid's configuration from the live runs and reload it when it changed.

        Converges under concurrent callers: each re-reads the runs after its reload and goes
        again when they changed, so the last reload always saw every run started before it.
        """
        with self._seam("configure the egress gateway"):
            for _ in range(5):
                clients = self.clients()
                conf = render_squid_conf(self.config, clients)
                if conf != self._pushed:
                    self._reload(conf)
                    self._pushed = conf
                if self.clients() == clients:
                    return
        log.warning("egress.sync_unsettled", extra={"network": self.config.network_name})

    def _reload(self, conf: str) -> None:
        container = self._client().containers.get(self.config.container_name)
        code, output = container.exec_run(
            [
                "/usr/local/bin/harness-gateway",
                "reload",
                _b64(conf),
                _b64(render_hosts(self.config)),
            ]
        )
        if code != 0:
            raise SandboxError(
                "the egress gateway refused its configuration: "
                + output.decode("utf-8", "replace").strip()[-800:]
            )

    # -- what it saw ----------------------------------------------------------------------

    def denials(self, client_ip: str, since: float, until: float | None = None) -> list[Denial]:
        """Refused attempts of ``client_ip`` logged between ``since`` and ``until`` (unix)."""
        with self._seam("read the egress gateway's log"):
            container = self._client().containers.get(self.config.container_name)
            kwargs: dict[str, Any] = {"since": since - 0.5, "stdout": True, "stderr": False}
            if until is not None:
                kwargs["until"] = until + 1.0
            text = container.logs(**kwargs).decode("utf-8", "replace")
        # A client that honours its proxy may still look the model's name up first (codex,
        # gemini and opencode do): a lookup of a name the run may reach is no attempt to
        # get out, and is not reported (it is answered NXDOMAIN like any other).
        allowed = {e.host for e in self.clients().get(client_ip, ())}
        found = []
        for line in text.splitlines():
            denial = parse_denial(line)
            if denial is None or denial.client != client_ip:
                continue
            if denial.protocol == "dns" and denial.host in allowed:
                continue
            found.append(denial)
        return found

    def address_of(self, container_id: str) -> str | None:
        """A container's address on the egress network (None when it is not on it)."""
        with self._seam("inspect a run's container"):
            try:
                container = self._client().containers.get(container_id)
            except docker.errors.NotFound:
                return None
        networks = container.attrs.get("NetworkSettings", {}).get("Networks", {})
        return (networks.get(self.config.network_name) or {}).get("IPAddress") or None

    def health(self) -> str:
        """``healthy``, ``starting``, ``unhealthy``, ``stopped`` or ``missing``."""
        with self._seam("inspect the egress gateway"):
            try:
                container = self._client().containers.get(self.config.container_name)
            except docker.errors.NotFound:
                return "missing"
        if container.status != "running":
            return "stopped"
        state = container.attrs.get("State", {}).get("Health", {}) or {}
        status = str(state.get("Status") or "running")
        if status == "starting":
            # Docker's first check comes after its start period: ask the gateway now.
            with self._seam("check the egress gateway"):
                code, _ = container.exec_run(["/usr/local/bin/harness-gateway", "check"])
            status = "healthy" if code == 0 else status
        return status

    def reap(self) -> str | None:
        """Replace a gateway that is unhealthy or stopped (Docker restarts one that crashed;
        one that hangs is the reaper's): removed, and started again at once when egress runs
        depend on it. What was done, or None."""
        state = self.health()
        if state not in ("unhealthy", "stopped"):
            return None
        with self._lock, self._seam("remove the egress gateway"):
            with contextlib.suppress(docker.errors.NotFound):
                self._client().containers.get(self.config.container_name).remove(force=True)
            self._ready = False
            self._pushed = ""
        log.warning("egress.gateway_reaped", extra={"state": state})
        with self._seam("list the egress runs"):
            runs = self._client().containers.list(
                filters={"network": self.config.network_name, "label": LABEL_HARNESS}
            )
        if runs:
            self.ensure()
            return f"replaced the {state} egress gateway ({len(runs)} egress runs)"
        return f"removed the {state} egress gateway"

    def remove(self) -> None:
        """Remove the gateway and the egress network (tests, ``harness reap --gateway``)."""
        with self._lock, self._seam("remove the egress gateway"):
            client = self._client()
            with contextlib.suppress(docker.errors.NotFound):
                client.containers.get(self.config.container_name).remove(force=True)
            with contextlib.suppress(docker.errors.NotFound):
                client.networks.get(self.config.network_name).remove()
            self._ready = False
            self._pushed = ""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
