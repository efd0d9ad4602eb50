"""The egress gateway on a Docker host: its network, its container, its configuration, what
it refused. The policy is :mod:`sandbox.network`; squid's configuration and the parsing of the
gateway's log are :mod:`sandbox.docker.egress`."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import docker.errors
import docker.types

from sandbox.base import Denial, SandboxError
from sandbox.docker.container import made_by_another
from sandbox.docker.egress import (
    BUILD_HINT,
    LABEL_CONFIG,
    LABEL_GATEWAY,
    parse_denial,
    render_hosts,
    render_squid_conf,
)
from sandbox.network import LABEL_BASE_URL, LABEL_HARNESS, EgressConfig, Endpoint

log = logging.getLogger(__name__)


class Gateway:
    """The egress network and gateway container of one scope on one Docker daemon.

    ``client`` returns a docker SDK client; ``seam`` translates Docker's errors (as in
    :mod:`sandbox.docker.sandbox`). Thread-safe; several workers on one daemon may call it at once
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
            if same and existing.status in ("created", "running"):
                # Another worker made it and is starting it (or started it a moment ago, its
                # squid perhaps not up yet: a reload would find no squid to reconfigure):
                # wait until it is ready, as that worker does. One check when it is.
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
            self._wait_healthy(self._made_by_another(name), timeout=30.0)
            return
        container = client.containers.get(created["Id"])
        client.networks.get(self.config.outside_network).connect(container)
        container.start()
        self._wait_healthy(container)
        log.info("egress.gateway_started", extra={"container": container.id})

    def _made_by_another(self, name: str) -> Any:
        """The gateway container another worker is creating (raises NotFound when that
        create failed)."""
        client = self._client()

        def find() -> Any:
            try:
                return client.containers.get(name)
            except docker.errors.NotFound:
                return None

        found = made_by_another(find)
        return found if found is not None else client.containers.get(name)

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


def remove_stale(client: Any, subnet: str) -> list[str]:
    """Remove egress networks of ours (any scope) that hold ``subnet``, with every container
    on them: what a killed test or benchmark left behind, before one takes the subnet again.
    Names of the networks removed."""
    removed = []
    for network in client.networks.list(filters={"label": LABEL_GATEWAY}):
        network.reload()
        pools = (network.attrs.get("IPAM") or {}).get("Config") or []
        if not any(pool.get("Subnet") == subnet for pool in pools):
            continue
        for container_id in network.attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.NotFound):
                client.containers.get(container_id).remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()
        removed.append(str(network.name))
    return removed
