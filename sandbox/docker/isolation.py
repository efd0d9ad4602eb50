"""Network ``bridge`` on a Docker host: a network of ours whose runs reach the internet and
what the operator allows, and nothing else.

Docker's default bridge lets a container open connections to every other container on it
(another tenant's run), to every service of the host listening on ``0.0.0.0`` (its address
on the bridge is the containers' gateway), and to any private or link-local address the host
routes to (the cloud metadata service at 169.254.169.254). Runs on ``bridge`` join
``harness-runs`` instead (one per Docker host and allowlist, shared by the deployments
there: :class:`~sandbox.network.BridgeConfig`), created here:

- **No traffic between its containers**: Docker's ``enable_icc=false``, and our own rule.
- **The host refuses them**: a rule in the host's ``INPUT`` chain, first, for the network's
  interface, refuses every connection a run opens to any address of the host (replies to
  connections the host opened pass), but for the operator's allowed destinations.
- **No IPv4 destination that is not public** (:data:`sandbox.addresses.NON_PUBLIC_IPV4`:
  private, loopback, link-local, shared, multicast, reserved), through Docker's
  ``DOCKER-USER`` chain (which Docker evaluates before its own), but for the operator's
  allowed destinations and DNS (port 53) to the host's resolvers, which Docker's DNS asks
  from the run's namespace; public addresses are reached as on Docker's bridge
  (masqueraded). No IPv6 at all.

A refusal is a TCP reset or an ICMP error: a run's client fails at once. The rules live in
the host's network namespace, so they are installed by a short-lived helper container with
the host's network and ``NET_ADMIN`` alone, from the egress gateway's image (it holds
iptables), which picks the iptables backend (nft or legacy) that holds Docker's own rules and
replaces our chains atomically (``iptables-restore --noflush``). A daemon that keeps no
iptables rules (``dockerd --iptables=false``), or a host whose bridges bypass iptables
(``bridge-nf-call-iptables`` off), cannot isolate its runs: :meth:`BridgeGuard.ensure` raises
:class:`~sandbox.base.SandboxError` saying so, and no run starts there on ``bridge``.

Installed once per process, before its first ``bridge`` container; the reaper checks them
again (:meth:`BridgeGuard.recheck`: a firewall reload or a reboot removes them) and puts back
what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import docker.errors

from sandbox.addresses import NON_PUBLIC_IPV4
from sandbox.base import SandboxError
from sandbox.docker.egress import BUILD_HINT
from sandbox.network import BridgeConfig

log = logging.getLogger(__name__)

LABEL_BRIDGE = "harness.bridge_network"
"""On the network of ours, and on the helper container that guards it: what it allows."""
GUARD_TIMEOUT_S = 60.0
ISOLATION_HINT = (
    "start dockerd with its iptables rules (not --iptables=false), use network none or "
    "egress, or set HARNESS_BRIDGE_ISOLATION=false to accept runs that reach each other and "
    "this host"
)

# $1 the network's interface, $2 $3 $4 our chains (forwarded, to the host, the refusal), then
# the allowed destinations (CIDR or CIDR:PORT). Exit 3: Docker keeps no iptables rules for the
# interface; 4: bridged traffic bypasses iptables; 5: an iptables command failed.
_GUARD = r"""set -u
iface=$1 fwd=$2 inp=$3 rej=$4
shift 4
fail() { code=$1; shift; echo "harness-guard: $*" >&2; exit "$code"; }
[ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] || fail 4 \
    "net.bridge.bridge-nf-call-iptables is not 1 on this host: traffic between the containers" \
    "of one bridge bypasses iptables"
ipt=
for candidate in iptables-nft iptables-legacy; do
    if "$candidate-save" -t filter 2>/dev/null | grep -q -e "-i $iface -o $iface -j DROP"; then
        ipt=$candidate
        break
    fi
done
[ -n "$ipt" ] || fail 3 "dockerd keeps no iptables rules for $iface (started with" \
    "--iptables=false?): its containers could reach each other and this host"
"$ipt" -w -n -L DOCKER-USER >/dev/null 2>&1 || fail 3 "no DOCKER-USER chain in $ipt"
restored=
# Our chains of networks that are gone (their interface with them): jumps and chains removed.
for chain in $("$ipt" -w -S | sed -n 's/^-N \(HRUN-[FIX]-[0-9a-f]*\)$/\1/p'); do
    gone=${chain#HRUN-?-}
    ip link show dev "br-$gone" >/dev/null 2>&1 && continue
    while "$ipt" -w -D INPUT -i "br-$gone" -j "HRUN-I-$gone" 2>/dev/null; do :; done
    while "$ipt" -w -D DOCKER-USER -i "br-$gone" -j "HRUN-F-$gone" 2>/dev/null; do :; done
    "$ipt" -w -F "$chain" 2>/dev/null
done
for chain in $("$ipt" -w -S | sed -n 's/^-N \(HRUN-[FIX]-[0-9a-f]*\)$/\1/p'); do
    gone=${chain#HRUN-?-}
    ip link show dev "br-$gone" >/dev/null 2>&1 || "$ipt" -w -X "$chain" 2>/dev/null
done
{
    echo "*filter"
    echo ":$rej - [0:0]"
    echo ":$fwd - [0:0]"
    echo ":$inp - [0:0]"
    echo "-A $rej -p tcp -j REJECT --reject-with tcp-reset"
    echo "-A $rej -j REJECT --reject-with icmp-admin-prohibited"
    echo "-A $fwd -o $iface -j $rej"
    echo "-A $inp -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
    # The resolvers Docker's own DNS forwards the runs' lookups to, from their namespace.
    resolvers=$(sed -n 's/^nameserver[[:space:]]*\([0-9.]*\)[[:space:]]*$/\1/p' /etc/resolv.conf)
    for ns in $resolvers; do
        for proto in udp tcp; do
            echo "-A $fwd -d $ns -p $proto --dport 53 -j RETURN"
            echo "-A $inp -d $ns -p $proto --dport 53 -j ACCEPT"
        done
    done
    for allowed in "$@"; do
        dest=${allowed%%:*}
        if [ "$dest" = "$allowed" ]; then
            match="-d $dest"
        else
            match="-d $dest -p tcp --dport ${allowed#*:}"
        fi
        echo "-A $fwd $match -j RETURN"
        echo "-A $inp $match -j ACCEPT"
    done
    for range in $NON_PUBLIC; do
        echo "-A $fwd -d $range -j $rej"
    done
    echo "-A $inp -j $rej"
    echo "COMMIT"
} | "$ipt-restore" -w --noflush || fail 5 "$ipt-restore refused our chains"
# Our jump first in its chain: anything inserted before it (a firewall's ACCEPT) would
# decide first.
first() {
    chain=$1 target=$2
    rules=$("$ipt" -w -S "$chain") || fail 5 "cannot list $chain"
    at=$(printf '%s\n' "$rules" | grep -n -e "^-A $chain -i $iface -j $target\$" | head -n 1)
    other=$(printf '%s\n' "$rules" | grep -n -e "^-A $chain" | grep -v -e "-j HRUN-" | head -n 1)
    if [ -z "$at" ] || { [ -n "$other" ] && [ "${other%%:*}" -lt "${at%%:*}" ]; }; then
        while "$ipt" -w -D "$chain" -i "$iface" -j "$target" 2>/dev/null; do :; done
        "$ipt" -w -I "$chain" 1 -i "$iface" -j "$target" || fail 5 "cannot insert into $chain"
        restored=1
    fi
}
first DOCKER-USER "$fwd"
first INPUT "$inp"
# No IPv6 from this network (it has no IPv6 address; a link-local one could still speak).
v6=${ipt%%-*}
v6="ip6${v6#ip}${ipt#iptables}"
for chain in INPUT FORWARD; do
    "$v6" -w -C "$chain" -i "$iface" -j REJECT 2>/dev/null ||
        "$v6" -w -I "$chain" 1 -i "$iface" -j REJECT 2>/dev/null || true
done
echo "ok $ipt${restored:+ restored}"
"""


class BridgeGuard:
    """Network ``bridge``'s network of one allowlist on one Docker daemon, and the host's rules
    that isolate it (see the module docstring). ``client`` returns a docker SDK client,
    ``seam`` translates Docker's errors. Thread-safe."""

    def __init__(self, config: BridgeConfig, client: Callable[[], Any], seam: Any) -> None:
        self.config = config
        self._client = client
        self._seam = seam
        self._lock = threading.Lock()
        self._network_id: str | None = None

    @property
    def network_name(self) -> str:
        return self.config.network_name

    def ensure(self) -> str:
        """Create the network when it is missing and install its rules, once per process
        (the reaper checks them again); what is in place, or SandboxError saying why runs
        cannot be isolated here."""
        with self._lock:
            if self._network_id is not None:
                return self._describe(self._network_id)
            with self._seam("isolate network bridge"):
                network_id = self._ensure_network()
                self._guard(network_id)
            self._network_id = network_id
            return self._describe(network_id)

    def recheck(self) -> str | None:
        """The reaper's care: when the network exists (runs of an earlier worker process may
        live on it), install its rules again if any went missing. What was done, or None."""
        with self._lock, self._seam("check network bridge's rules"):
            try:
                network = self._client().networks.get(self.network_name)
            except docker.errors.NotFound:
                self._network_id = None  # made again by the next bridge run
                return None
            self._check_ours(network.attrs)
            network_id = str(network.id)
            restored = self._guard(network_id)
            self._network_id = network_id
        if not restored:
            return None
        log.warning("bridge.rules_restored", extra={"network": self.network_name})
        return f"restored the isolation rules of network {self.network_name}"

    def forget(self) -> None:
        """The network is gone (removed by hand): the next :meth:`ensure` makes it again."""
        with self._lock:
            self._network_id = None

    def remove(self) -> None:
        """Remove the network (a test's own allowlist); Docker refuses while a container is
        on it, and workers of another deployment sharing it make it again. Its rules go at
        the next guard's sweep."""
        with self._lock, self._seam("remove network bridge's network"):
            with contextlib.suppress(docker.errors.NotFound):
                self._client().networks.get(self.network_name).remove()
            self._network_id = None

    def _describe(self, network_id: str) -> str:
        allowed = ", ".join(str(d) for d in self.config.allow) or "nothing private"
        return (
            f"network {self.network_name} (interface br-{network_id[:12]}): no traffic between "
            f"runs, none to this host or private addresses; allowed: {allowed}"
        )

    def _ensure_network(self) -> str:
        client = self._client()
        name = self.network_name
        for _ in range(20):
            try:
                network = client.networks.get(name)
            except docker.errors.NotFound:
                network = None
            if network is not None:
                self._check_ours(network.attrs)
                return str(network.id)
            try:
                created = client.networks.create(
                    name,
                    driver="bridge",
                    options={
                        "com.docker.network.bridge.enable_icc": "false",
                        "com.docker.network.bridge.enable_ip_masquerade": "true",
                    },
                    labels={LABEL_BRIDGE: self.config.allowlist},
                    check_duplicate=True,
                )
                log.info("bridge.network_created", extra={"network": name, "id": created.id})
                return str(created.id)
            except docker.errors.APIError:
                time.sleep(0.25)  # another worker is creating it: found at the next lookup
        raise SandboxError(f"cannot create network {name} for network bridge's runs")

    def _check_ours(self, attrs: dict[str, Any]) -> None:
        options = attrs.get("Options") or {}
        labels = attrs.get("Labels") or {}
        ours = (
            attrs.get("Driver") == "bridge"
            and labels.get(LABEL_BRIDGE) == self.config.allowlist
            and options.get("com.docker.network.bridge.enable_icc") == "false"
            and "com.docker.network.bridge.name" not in options
        )
        if not ours:
            raise SandboxError(
                f"network {self.network_name} exists but is not an isolated network of ours "
                "(made by hand?)",
                hint=f"remove it (docker network rm {self.network_name}) when no container uses it",
            )

    def _guard(self, network_id: str) -> bool:
        """Install the rules of the network's interface; whether any was missing."""
        digest = network_id[:12]
        args = [
            f"br-{digest}",
            f"HRUN-F-{digest}",
            f"HRUN-I-{digest}",
            f"HRUN-X-{digest}",
            *(str(d) for d in self.config.allow),
        ]
        client = self._client()
        image = self.config.guard_image
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"network bridge's guard needs the image {image}, which is not on this Docker host",
                hint=BUILD_HINT,
            ) from None
        container = client.containers.create(
            image,
            ["/bin/sh", "-c", _GUARD, "harness-guard", *args],
            entrypoint=[],
            user="0:0",
            environment={"NON_PUBLIC": " ".join(NON_PUBLIC_IPV4)},
            labels={LABEL_BRIDGE: self.config.allowlist},
            network_mode="host",
            cap_drop=["ALL"],
            cap_add=["NET_ADMIN"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/run": "rw,nosuid,nodev", "/tmp": "rw,nosuid,nodev"},
            mem_limit="64m",
            pids_limit=64,
        )
        try:
            container.start()
            code = int(container.wait(timeout=GUARD_TIMEOUT_S).get("StatusCode", -1))
            out: str = container.logs(stdout=True, stderr=False).decode("utf-8", "replace").strip()
            err: str = container.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip()
        finally:
            container.remove(force=True)
        if code != 0:
            reason = err[-600:] or f"the guard exited with {code}"
            raise SandboxError(
                f"runs on network bridge cannot be isolated on this Docker host: {reason}",
                hint=ISOLATION_HINT,
            )
        log.info("bridge.rules", extra={"network": self.network_name, "result": out})
        return out.endswith("restored")
