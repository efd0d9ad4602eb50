"""``harness doctor``: is everything a worker needs here, and if not, how to fix it.

Each check is one line with a level: ``ok``, ``warn`` (works, but looks wrong) or ``fail``
(something is missing or broken; the exit status is then 1), and for anything not ok the fix
in one sentence. What is checked: Redis (its persistence and eviction policy too), the
broker, live workers, the Docker daemon, the image of every harness, that a container really
starts on the default network (HARNESS_NETWORK), the CLI versions inside those images
(against the pins in docker/clis/package.json), the harness binaries for the local backend,
and settings that look wrong. ``--json`` prints one object: ``ok``, ``checks`` and every harness's
``capabilities``. URLs are printed with their password masked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from rich.console import Console
from rich.text import Text

import adapters
from config import Settings, load_settings
from config.harnesses import DEMO_IMAGE
from sandbox.base import (
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_SCOPE,
    Limits,
    NetworkPolicy,
    RunSpec,
)
from worker.options.policy import memory_bytes

# The password of a URL's user part runs to the last "@" before the path: "p@ss" unencoded
# is masked whole. Redis also takes a password in the query string.
_URL_PASSWORD = re.compile(r"(://[^:/?#@\s]*:)[^/?#\s]*@")
_QUERY_PASSWORD = re.compile(r"([?&;](?:password|passwd|pwd)=)[^&#;\s]*", re.IGNORECASE)
_URL_HOST = re.compile(r"^[a-z0-9+]+://(?:[^/]*@)?\[?([^\]/:?]*)")

#: npm package of each vendor harness in docker/clis/package.json, and its binary.
CLI_PACKAGES: dict[str, tuple[str, str]] = {
    "claude-code": ("@anthropic-ai/claude-code", "claude"),
    "codex": ("@openai/codex", "codex"),
    "gemini": ("@google/gemini-cli", "gemini"),
    "opencode": ("opencode-ai", "opencode"),
    "pi": ("@mariozechner/pi-coding-agent", "pi"),
}
PINS_FILE = Path(__file__).resolve().parents[2] / "docker" / "clis" / "package.json"
BUILD_FIX = "build the images on this Docker host with scripts/build-images"

#: Label of the network probe's container, besides the sandbox's own labels
#: (``harness.managed``, ``harness.run_id`` = ``doctor-...``, ``harness.scope``): the reaper
#: finds a probe that a killed doctor left behind (it has no run record) and removes it.
LABEL_DOCTOR_PROBE = "harness.doctor_probe"
PROBE_RUN_PREFIX = "doctor-"
NETWORK_PROBE_TIMEOUT_S = 60.0

# Runs inside an image as its user, network off: which harness binaries it has, and (for the
# CLI image) each pinned npm package's installed version, as JSON from node.
_PROBE = r"""for b in claude codex gemini opencode pi harness-demo; do
    p=$(command -v "$b" 2>/dev/null) && echo "bin $b $p"
done
if [ -f /opt/harness-clis/package.json ] && command -v node >/dev/null 2>&1; then
    cd /opt/harness-clis && node -e '
const fs = require("fs");
const pins = JSON.parse(fs.readFileSync("package.json")).dependencies || {};
const out = {};
for (const [name, pinned] of Object.entries(pins)) {
    let installed = null;
    const file = "node_modules/" + name + "/package.json";
    try { installed = JSON.parse(fs.readFileSync(file)).version; } catch (e) {}
    out[name] = {pinned, installed};
}
console.log("pkgs " + JSON.stringify(out));'
fi
"""


def mask_url(url: str) -> str:
    """A URL with its password replaced, safe to print."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url))


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    level: str = ""
    """``ok``, ``warn`` or ``fail``; derived from ``ok`` when not given."""

    def __post_init__(self) -> None:
        if not self.level:
            self.level = "ok" if self.ok else "fail"


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, True, detail, fix, level="warn")


# -- services ---------------------------------------------------------------------------------


def _redis(settings: Settings) -> Check:
    import redis

    try:
        redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3).ping()
        return Check("redis", True, mask_url(settings.redis_url))
    except redis.RedisError as exc:
        return Check(
            "redis",
            False,
            f"{mask_url(settings.redis_url)}: {exc}",
            "start Redis (redis-server --daemonize yes) or set HARNESS_REDIS_URL",
        )
    except ValueError as exc:  # redis-py's word for a URL it cannot parse
        return Check(
            "redis",
            False,
            f"HARNESS_REDIS_URL is not a Redis URL: {exc}",
            "set HARNESS_REDIS_URL to redis://HOST:PORT/DB (or rediss://, unix://PATH)",
        )


PERSISTENCE_FIX = (
    "start redis-server with --appendonly yes (scripts/setup does), or CONFIG SET appendonly "
    'yes then CONFIG REWRITE; docs/operations.md, "Running in production"'
)


def redis_config_checks(settings: Settings) -> list[Check]:
    """Whether Redis keeps its data over a restart (``appendonly`` or ``save``), and whether it
    may evict keys (``maxmemory-policy``). Without persistence a restart loses every run: its
    followers are told the run is lost. A Redis that refuses CONFIG (a managed one, or an ACL
    user without it) is noted, not failed: its provider says how it persists."""
    import redis

    client = redis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=3, decode_responses=True
    )
    try:
        config: dict[str, str] = {}
        for name in ("appendonly", "save", "maxmemory", "maxmemory-policy"):
            config.update(cast(dict[str, str], client.config_get(name)))
    except redis.ResponseError as exc:
        return [
            Check(
                "redis persistence",
                True,
                f"not known: Redis refused CONFIG GET ({exc}); a managed Redis says how it "
                "persists: keep an append-only file or snapshots, and noeviction",
            )
        ]
    except redis.RedisError as exc:
        return [Check("redis persistence", False, f"cannot ask Redis: {exc}", "start Redis")]
    finally:
        client.close()
    return [_persistence(config), _eviction(config)]


def _persistence(config: dict[str, str]) -> Check:
    save = (config.get("save") or "").strip()
    if config.get("appendonly") == "yes":
        return Check("redis persistence", True, "appendonly yes")
    if save:
        return Check(
            "redis persistence",
            True,
            f"RDB snapshots only (save {save}): a crash loses what came after the last one",
        )
    return warn(
        "redis persistence",
        'none (appendonly no, save ""): a restart of Redis loses every run, and whoever '
        "follows one is told it is lost",
        PERSISTENCE_FIX,
    )


def _eviction(config: dict[str, str]) -> Check:
    policy = config.get("maxmemory-policy") or "noeviction"
    if policy == "noeviction" or config.get("maxmemory") in (None, "", "0"):
        return Check("redis eviction", True, f"maxmemory-policy {policy}")
    return warn(
        "redis eviction",
        f"maxmemory-policy {policy}: at maxmemory Redis drops keys, runs' records and "
        "streams included (their followers are told the run is lost)",
        "CONFIG SET maxmemory-policy noeviction (a full Redis then refuses writes instead)",
    )


def _broker(settings: Settings) -> Check:
    from kombu.connection import Connection

    try:
        with Connection(settings.broker_url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        return Check("broker", True, mask_url(settings.broker_url))
    except Exception as exc:  # noqa: BLE001 -- kombu raises many transport-specific errors
        return Check(
            "broker",
            False,
            f"{mask_url(settings.broker_url)}: {mask_url(str(exc))}",
            "start the broker or set HARNESS_BROKER_URL",
        )


def _workers(settings: Settings) -> Check:
    """Hosts with a live worker (their heartbeat key), from Redis."""
    import redis

    from worker.fleet import hosts
    from worker.store.keys import Keys, SyncRedis

    keys = Keys(settings.key_prefix)
    try:
        client = cast(
            SyncRedis,
            redis.Redis.from_url(
                settings.redis_url, socket_connect_timeout=3, decode_responses=True
            ),
        )
        queues = sorted(client.hkeys(keys.hosts()))
        live = [q for q in queues if hosts.alive(client, keys, q)]
    except redis.RedisError as exc:
        return Check("workers", False, f"cannot read the worker hosts: {exc}", "start Redis")
    if not live:
        return warn(
            "workers",
            f"no live worker under prefix {settings.key_prefix!r}: turns will wait in the queue",
            "start one with: celery -A worker.app worker",
        )
    return Check("workers", True, f"{len(live)} live host(s): {', '.join(live)}")


# -- Docker, images and CLIs ------------------------------------------------------------------


def _backends(settings: Settings) -> set[str]:
    allowed = set(settings.allowed_sandboxes)
    if "*" in allowed:
        return {"docker", "local"}
    return {settings.sandbox} | (allowed & {"docker", "local"})


def _docker_client(settings: Settings) -> Any:
    from docker.client import DockerClient, from_env

    if settings.docker_url:
        return DockerClient(base_url=settings.docker_url, timeout=60)
    return from_env(timeout=60)


class _Gateway(Protocol):
    def ensure(self) -> None: ...

    def health(self) -> str: ...


class _BridgeGuard(Protocol):
    def ensure(self) -> str: ...


class _DockerBackend(Protocol):
    """What doctor asks of the docker backend besides the Sandbox protocol: is the daemon
    there, is an image on it, how it hardens a container, its egress gateway and network
    ``bridge``'s guard."""

    egress: _Gateway | None
    bridge: _BridgeGuard | None

    def ping(self) -> None: ...

    def image_exists(self, image: str) -> bool: ...

    def hardened(self, spec: RunSpec) -> dict[str, Any]: ...


def _docker_backend(settings: Settings) -> _DockerBackend:
    """The docker backend as a worker with these settings builds it (the runtime's factory,
    so doctor checks the sandbox that runs turns, not one configured apart)."""
    from worker.runtime import make_sandbox

    return cast(_DockerBackend, make_sandbox("docker", settings))


def _docker(settings: Settings) -> list[Check]:
    from sandbox.base import SandboxError

    needed = "docker" in _backends(settings)
    where = settings.docker_url or os.environ.get("DOCKER_HOST") or "the local daemon"
    try:
        sandbox = _docker_backend(settings)
    except ImportError as exc:
        return [
            Check("docker", False, f"the Docker backend cannot load: {exc}", "pip install docker")
        ]
    try:
        sandbox.ping()
    except SandboxError as exc:
        if not needed:
            return [Check("docker", True, f"not used (HARNESS_SANDBOX=local); {exc}", level="ok")]
        return [
            Check(
                "docker",
                False,
                f"{mask_url(where)}: {exc}",
                "start dockerd (scripts/ensure-docker) or set HARNESS_DOCKER_URL",
            )
        ]
    checks = [Check("docker", True, mask_url(where))]
    users: dict[str, list[str]] = {}
    for harness in adapters.HARNESS_IDS:
        image = settings.image_for(harness)
        if image:
            users.setdefault(image, []).append(harness)
    present_images = {image: sandbox.image_exists(image) for image in users}
    checks.append(_network(settings, present_images, needed))
    if settings.network == "bridge":
        checks.append(bridge_check(settings, needed))
    pins = _repo_pins()
    for image, harnesses in sorted(users.items()):
        present = present_images[image]
        used_by = ", ".join(harnesses)
        if not present:
            level_ok = not needed
            checks.append(
                Check(
                    f"image {image}",
                    level_ok,
                    f"missing (used by {used_by})",
                    BUILD_FIX,
                    level="warn" if level_ok else "fail",
                )
            )
            continue
        checks.append(Check(f"image {image}", True, f"present (used by {used_by})"))
        checks += _image_clis(settings, image, harnesses, pins)
    return checks


def _network(settings: Settings, present_images: dict[str, bool], needed: bool) -> Check:
    """The network check: a probe container started on HARNESS_NETWORK from a present image
    (for network ``egress``: the egress gateway, see :func:`egress_check`)."""
    if settings.network == "egress":
        return egress_check(settings, needed)
    image = probe_image_for(present_images)
    if image is None:
        return Check(
            f"network {settings.network}",
            not needed,
            "not probed: none of the configured images is on this Docker host",
            BUILD_FIX,
            level="fail" if needed else "warn",
        )
    check = network_probe(settings, image)
    if not check.ok and not needed:
        check.ok, check.level = True, "warn"
    return check


def egress_check(settings: Settings, needed: bool = True) -> Check:
    """The egress gateway of this Docker host: its image, started (as a worker would) and
    healthy, its configuration accepted, and what each harness may reach."""
    from sandbox.base import SandboxError
    from worker.options.policy import egress_config

    config = egress_config(settings)
    name = f"network egress (gateway {config.container_name})"
    fix = "scripts/build-images --only gateway; docker logs " + config.container_name
    try:
        sandbox = _docker_backend(settings)  # its gateway is configured as a worker's is
        assert sandbox.egress is not None
        if not sandbox.image_exists(config.image):
            return Check(name, not needed, f"image {config.image} is missing", fix,
                         level="fail" if needed else "warn")  # fmt: skip
        sandbox.egress.ensure()
        state = sandbox.egress.health()
    except SandboxError as exc:
        return Check(name, False, str(exc), fix)
    if state not in ("healthy", "starting", "running"):
        return Check(name, False, f"the gateway is {state}", fix)
    allowed = "; ".join(
        f"{harness}: {', '.join(str(e) for e in endpoints) or '(nothing)'}"
        for harness, endpoints in sorted(config.allow.items())
    )
    producer = "plus a run's --base-url" if config.allow_base_url else "no --base-url hosts"
    return Check(
        name,
        True,
        f"{state}, proxy {config.proxy_url} on {config.network_name} ({config.subnet}); "
        f"allowed: {allowed}; {producer}",
    )


def bridge_check(settings: Settings, needed: bool = True) -> Check:
    """Network ``bridge``'s isolation on this Docker host: its network and the host's rules,
    made (as a worker would) and in place."""
    from sandbox.base import SandboxError

    name = "network bridge isolation"
    guard = _docker_backend(settings).bridge
    if guard is None:
        return warn(
            name,
            "off (HARNESS_BRIDGE_ISOLATION=false): runs on bridge reach each other and this "
            "host's services",
            "set HARNESS_BRIDGE_ISOLATION=true (dockerd must keep its iptables rules)",
        )
    try:
        detail = guard.ensure()
    except SandboxError as exc:
        return Check(name, not needed, str(exc), exc.hint, level="fail" if needed else "warn")
    return Check(name, True, detail)


def probe_image_for(present_images: dict[str, bool]) -> str | None:
    """The image to start the network probe from: the demo image if present, else any."""
    ordered = sorted(present_images, key=lambda image: (image != DEMO_IMAGE, image))
    return next((image for image in ordered if present_images[image]), None)


def network_probe(
    settings: Settings, image: str, network: str | None = None, *, client: Any = None
) -> Check:
    """Start a short-lived container like a run's on ``network`` (default HARNESS_NETWORK),
    run ``true`` in it, wait for it and remove it, on every path. A failure is reported with
    Docker's own words and a fix."""
    import docker.errors

    network = network or settings.network
    user = settings.container_user
    try:
        client = client or _docker_client(settings)
    except Exception as exc:  # noqa: BLE001 -- any Docker failure is a finding here
        return network_failure(network, image, user, _docker_error(exc))
    error: str | None = None
    leftover = container_name = ""
    try:
        for attempt in range(2):
            run_id = f"{PROBE_RUN_PREFIX}{uuid.uuid4().hex[:12]}"
            container_name = f"harness-run-{run_id}"
            try:
                error = _run_probe(
                    client, image, _probe_args(settings, run_id, container_name, network)
                )
            except docker.errors.NotFound as exc:
                error = _docker_error(exc)
                # A reaper removes a container without a run record: start a new probe, once.
                if attempt == 0 and "no such container" in error.lower():
                    continue
            except Exception as exc:  # noqa: BLE001 -- any Docker failure is a finding here
                error = _docker_error(exc)
            finally:
                leftover = _remove_probe(client, container_name)
            break
    finally:
        client.close()
    if error is not None:
        check = network_failure(network, image, user, error)
        if leftover:
            check.detail += f"; {leftover}"
        return check
    detail = f"a probe container from {image} started on it and exited 0"
    if leftover:
        return warn(
            f"network {network}",
            f"{detail}, but {leftover}",
            f"remove it: docker rm -f {container_name}",
        )
    return Check(f"network {network}", True, detail)


def _run_probe(client: Any, image: str, args: dict[str, Any]) -> str | None:
    """Create, start and wait for the probe: None when it exited 0, else what went wrong."""
    container = client.containers.create(image, ["true"], **args)
    container.start()
    result = container.wait(timeout=NETWORK_PROBE_TIMEOUT_S)
    code = int(result.get("StatusCode", -1))
    if code == 0:
        return None
    output = container.logs(stdout=True, stderr=True)[-400:]
    text = output.decode("utf-8", "replace").strip()
    error = (result.get("Error") or {}).get("Message") or text or "no output"
    return f"the probe exited with {code}: {error}"


def _probe_args(
    settings: Settings, run_id: str, container_name: str, network: str
) -> dict[str, Any]:
    """A run's container as the settings shape it (the sandbox's own hardening), for the probe."""
    spec = RunSpec(
        run_id=run_id,
        network=cast(NetworkPolicy, network),
        limits=Limits(settings.memory, settings.cpus, settings.pids),
        user=settings.container_user,
        read_only_root=settings.read_only_root,
    )
    return {
        "name": container_name,
        "entrypoint": [],
        "labels": {
            LABEL_MANAGED: "true",
            LABEL_RUN: run_id,
            LABEL_SCOPE: settings.key_prefix,
            LABEL_LEASE: f"{time.time() + 2 * NETWORK_PROBE_TIMEOUT_S:.0f}",
            LABEL_DOCTOR_PROBE: "true",
        },
        **_docker_backend(settings).hardened(spec),
    }


def _remove_probe(client: Any, container_name: str) -> str:
    """Remove the probe container if it exists; what went wrong, or "" when it is gone."""
    import docker.errors

    try:
        client.api.remove_container(container_name, force=True)
    except docker.errors.NotFound:
        pass
    except Exception as exc:  # noqa: BLE001 -- reported, never raised
        return f"its container {container_name} could not be removed: {_docker_error(exc)}"
    return ""


def _docker_error(exc: BaseException) -> str:
    """Docker's own words for a failure (the daemon's message, not the HTTP wrapper)."""
    import docker.errors
    import requests.exceptions

    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return f"no answer from the Docker daemon within {NETWORK_PROBE_TIMEOUT_S:g}s"
    return str(exc) or type(exc).__name__


def network_failure(network: str, image: str, user: str, error: str) -> Check:
    """The failed network check for Docker's error text, with the fix that error calls for."""
    lowered = error.lower()
    bridge = re.search(r"could not find bridge (\S+?):", error)
    if bridge:
        iface = bridge.group(1)
        fix = (
            f"the bridge interface {iface} of Docker's default network is gone from this host "
            "(a second dockerd started with --bridge none deletes docker0): restart dockerd "
            f"so it creates {iface} again, or set HARNESS_NETWORK=none"
        )
    elif re.search(r"network \S+ not found", lowered):
        if network == "bridge":
            fix = (
                "this Docker daemon has no default bridge network (started with --bridge "
                "none?): restart dockerd without it, or set HARNESS_NETWORK=none"
            )
        else:
            fix = (
                f"create it (docker network create {network}) or set HARNESS_NETWORK to a "
                "network this Docker host has"
            )
    elif "no such image" in lowered or ("not found" in lowered and image in error):
        fix = BUILD_FIX
    elif any(w in lowered for w in ("connection aborted", "connection refused", "no such file")):
        fix = "start dockerd (scripts/ensure-docker) or set HARNESS_DOCKER_URL"
    elif "no answer" in lowered or "timed out" in lowered:
        fix = "check the Docker daemon (docker info, its log); it may be overloaded"
    else:
        fix = (
            f"reproduce it by hand: docker run --rm --network {network} --user {user} "
            f"--cap-drop ALL --security-opt no-new-privileges --read-only {image} true"
        )
    return Check(
        f"network {network}",
        False,
        f"no container starts on it (probe from {image}): {mask_url(error)}",
        fix,
    )


def _repo_pins() -> dict[str, str]:
    try:
        return dict(json.loads(PINS_FILE.read_text()).get("dependencies") or {})
    except (OSError, ValueError):
        return {}


def probe_image(settings: Settings, image: str) -> tuple[dict[str, str], dict[str, Any]]:
    """Run the probe in a throwaway container: (binaries found, npm package versions)."""
    client = _docker_client(settings)
    try:
        output = client.containers.run(
            image,
            ["sh", "-c", _PROBE],
            entrypoint=[],
            network_mode="none",
            user=settings.container_user,
            remove=True,
            stdout=True,
            stderr=False,
        )
    finally:
        client.close()
    binaries: dict[str, str] = {}
    packages: dict[str, Any] = {}
    for line in output.decode("utf-8", "replace").splitlines():
        if line.startswith("bin "):
            _, name, path = line.split(" ", 2)
            binaries[name] = path
        elif line.startswith("pkgs "):
            packages = json.loads(line[5:])
    return binaries, packages


def _image_clis(
    settings: Settings, image: str, harnesses: list[str], pins: dict[str, str]
) -> list[Check]:
    try:
        binaries, packages = probe_image(settings, image)
    except Exception as exc:  # noqa: BLE001 -- any Docker failure is a finding here
        return [
            Check(
                f"clis in {image}",
                False,
                f"cannot run the image: {exc}",
                "check the image with docker run --rm IMAGE sh -c true, or rebuild it",
            )
        ]
    checks = []
    for harness in harnesses:
        name = f"cli {harness}"
        if harness == "stdio-json":
            # The generic protocol runs whatever executable a producer names; the demo ships.
            if "harness-demo" in binaries:
                checks.append(Check(name, True, f"harness-demo in {image}"))
            else:
                checks.append(
                    warn(name, f"no harness-demo in {image}", "add your harness to the image")
                )
            continue
        package, binary = CLI_PACKAGES[harness]
        found = packages.get(package) or {}
        installed, pinned = found.get("installed"), pins.get(package) or found.get("pinned")
        if binary not in binaries or not installed:
            checks.append(Check(name, False, f"{binary} is not installed in {image}", BUILD_FIX))
        elif pinned and installed != pinned:
            checks.append(
                warn(
                    name,
                    f"{binary} {installed} in {image}, but docker/clis/package.json pins {pinned}",
                    "rebuild the image with scripts/build-images --force, then re-record the "
                    "fixtures (docs/operations.md, Upgrading a CLI)",
                )
            )
        else:
            checks.append(Check(name, True, f"{binary} {installed} in {image}"))
    return checks


def _local_binaries(settings: Settings) -> list[Check]:
    """For the local backend: the vendor CLIs and allowed executables on this host's PATH."""
    if "local" not in _backends(settings):
        return []
    checks = []
    for harness, (_, binary) in CLI_PACKAGES.items():
        path = shutil.which(binary)
        if path:
            checks.append(Check(f"local {harness}", True, path))
        else:
            checks.append(
                warn(
                    f"local {harness}",
                    f"{binary} is not on PATH: the local backend cannot run {harness}",
                    "install the pinned CLIs with scripts/install-clis and put its bin on PATH",
                )
            )
    return checks


# -- settings that look wrong -----------------------------------------------------------------


def _memory_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _is_loopback(url: str) -> bool:
    match = _URL_HOST.match(url)
    host = match.group(1) if match else ""
    return host in ("", "localhost", "::1") or host.startswith("127.")


def settings_checks(settings: Settings, memory_total: int | None = None) -> list[Check]:
    """Settings that are valid but look wrong, each with its fix."""
    out = [
        *_timing_checks(settings),
        *_isolation_checks(settings),
        *_deployment_checks(settings),
        *_memory_checks(settings, memory_total),
    ]
    return out or [Check("settings", True, "nothing looks wrong")]


def _timing_checks(s: Settings) -> list[Check]:
    """Timeouts that undo each other."""
    out: list[Check] = []
    longest = s.max_turn_timeout_s + s.shutdown_grace_s
    if s.visibility_timeout_s and s.visibility_timeout_s < longest:
        out.append(
            Check(
                "setting HARNESS_VISIBILITY_TIMEOUT_S",
                False,
                f"{s.visibility_timeout_s}s is shorter than the longest turn ({longest:g}s): "
                "the broker would deliver a running turn again",
                "set HARNESS_VISIBILITY_TIMEOUT_S=0 (derived) or above "
                "HARNESS_MAX_TURN_TIMEOUT_S + HARNESS_SHUTDOWN_GRACE_S",
            )
        )
    if s.idle_timeout_s >= s.turn_timeout_s:
        out.append(
            warn(
                "setting HARNESS_IDLE_TIMEOUT_S",
                f"{s.idle_timeout_s:g}s is not below the turn timeout ({s.turn_timeout_s:g}s), "
                "so a silent harness is only caught by the turn timeout",
                "set HARNESS_IDLE_TIMEOUT_S below HARNESS_TURN_TIMEOUT_S",
            )
        )
    return out


def _isolation_checks(s: Settings) -> list[Check]:
    """What producers may ask for that weakens a run's isolation."""
    out: list[Check] = []
    if s.sandbox == "local":
        out.append(
            warn(
                "setting HARNESS_SANDBOX",
                "local: harnesses run as this worker's user, without a container",
                "use HARNESS_SANDBOX=docker anywhere but a development machine",
            )
        )
    elif "local" in s.allowed_sandboxes or "*" in s.allowed_sandboxes:
        out.append(
            warn(
                "setting HARNESS_ALLOWED_SANDBOXES",
                "producers may choose the local backend, which has no isolation",
                "remove local from HARNESS_ALLOWED_SANDBOXES",
            )
        )
    if s.network == "host" or "host" in s.allowed_networks or "*" in s.allowed_networks:
        out.append(
            warn(
                "setting HARNESS_ALLOWED_NETWORKS",
                "runs may use host networking (the host's services, loopback included)",
                "allow only none and bridge unless a harness must reach this host",
            )
        )
    if "*" in s.allowed_executables:
        out.append(
            warn(
                "setting HARNESS_ALLOWED_EXECUTABLES",
                "producers may run any executable as the stdio-json harness",
                "list the executables by name",
            )
        )
    if "*" in s.allowed_images:
        out.append(
            warn(
                "setting HARNESS_ALLOWED_IMAGES",
                "producers may run any image",
                "list the images (or HARNESS=IMAGE pairs) producers may name",
            )
        )
    if s.container_user.split(":")[0] == "0":
        out.append(
            warn(
                "setting HARNESS_CONTAINER_USER",
                "harnesses run as root inside their containers",
                "use a non-root uid such as 1000:1000",
            )
        )
    if not s.read_only_root:
        out.append(
            warn(
                "setting HARNESS_READ_ONLY_ROOT",
                "a harness can change its container's filesystem outside the workspace",
                "set HARNESS_READ_ONLY_ROOT=true",
            )
        )
    return out


def _deployment_checks(s: Settings) -> list[Check]:
    """How the worker reaches its services, and what sees its turns."""
    out: list[Check] = []
    if s.pool == "prefork" and s.metrics_port:
        out.append(
            warn(
                "setting HARNESS_POOL",
                "prefork runs turns in child processes: the metrics endpoint does not see them",
                "use HARNESS_POOL=threads (the default)",
            )
        )
    for name, url in (("HARNESS_REDIS_URL", s.redis_url), ("HARNESS_BROKER_URL", s.broker_url)):
        if not _is_loopback(url) and not _URL_PASSWORD.search(url):
            out.append(
                warn(
                    f"setting {name}",
                    f"{mask_url(url)} is not on this machine and has no password",
                    "require a password (and TLS, rediss:// or amqps://) on shared networks",
                )
            )
    if (
        s.docker_url
        and s.docker_url.startswith("tcp://")
        and not os.environ.get("DOCKER_TLS_VERIFY")
    ):
        out.append(
            warn(
                "setting HARNESS_DOCKER_URL",
                f"{s.docker_url} without TLS: anyone who reaches it controls that host",
                "use an ssh:// or TLS-verified daemon URL, or a local socket",
            )
        )
    return out


def _memory_checks(s: Settings, memory_total: int | None) -> list[Check]:
    """The default memory limit against its ceiling and this machine."""
    out: list[Check] = []
    memory_total = memory_total if memory_total is not None else _memory_total()
    memory = memory_bytes(s.memory)
    if memory > memory_bytes(s.max_memory):
        out.append(
            warn(
                "setting HARNESS_MEMORY",
                f"the default limit {s.memory} is above the ceiling HARNESS_MAX_MEMORY="
                f"{s.max_memory} that producers are held to",
                "keep HARNESS_MEMORY at or below HARNESS_MAX_MEMORY",
            )
        )
    if memory_total and memory > memory_total:
        out.append(
            warn(
                "setting HARNESS_MEMORY",
                f"one run may use {s.memory}, more than this machine's "
                f"{memory_total / 1024**3:.1f} GiB",
                "lower HARNESS_MEMORY below the machine's memory",
            )
        )
    return out


# -- the command ------------------------------------------------------------------------------


def collect(settings: Settings | None = None) -> list[Check]:
    settings = settings or load_settings()
    checks = [_redis(settings), _broker(settings)]
    if checks[0].ok:
        checks += redis_config_checks(settings)
        checks.append(_workers(settings))
    checks += _docker(settings)
    checks += _local_binaries(settings)
    checks += settings_checks(settings)
    return checks


_MARKS = {"ok": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red")}


def run_doctor(json_output: bool = False, check: Callable[[], list[Check]] = collect) -> int:
    checks = check()
    ok = all(c.ok for c in checks)
    if json_output:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "checks": [asdict(c) for c in checks],
                    "capabilities": {
                        h: adapters.capabilities(h) for h in adapters.HARNESS_IDS if _importable(h)
                    },
                }
            )
        )
        return 0 if ok else 1
    console = Console(file=sys.stdout, highlight=False, markup=False, emoji=False, soft_wrap=True)
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark, style = _MARKS.get(c.level, ("?", ""))
        line = Text(f"{mark} ", style=style)
        line.append(f"{c.name:<{width}}  ", style="bold" if c.level != "ok" else "")
        line.append(c.detail, style="" if c.level == "ok" else style)
        console.print(line)
        if c.fix and c.level != "ok":
            console.print(Text(f"  {'':<{width}}  → {c.fix}", style="dim"))
    failed = sum(1 for c in checks if c.level == "fail")
    warned = sum(1 for c in checks if c.level == "warn")
    verdict = "all good" if ok and not warned else f"{failed} failed, {warned} warning(s)"
    console.print(Text(verdict, style="bold green" if ok else "bold red"))
    return 0 if ok else 1


def _importable(harness: str) -> bool:
    try:
        adapters.get(harness)
    except ImportError:
        return False
    return True


def _cell(value: object) -> str:
    if isinstance(value, dict):  # steering: the modes taken on the CLI's own channel
        native = [f"{mode}: {how}" for mode, how in value.items() if how != "emulated"]
        return ", ".join(native) or "emulated"
    return "yes" if value is True else "no" if value is False else str(value)


def capability_table() -> str:
    """The capability table of docs/adapters.md, from the adapters themselves (Markdown)."""
    caps = {h: adapters.capabilities(h) for h in adapters.HARNESS_IDS if _importable(h)}
    names = list(next(iter(caps.values())))
    lines = [
        "| capability | " + " | ".join(f"`{h}`" for h in caps) + " |",
        "|---|" + "---|" * len(caps),
    ]
    for name in names:
        cells = [_cell(caps[h][name]) for h in caps]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--capabilities"]:
        sys.stdout.write(capability_table())
    else:
        sys.exit(run_doctor(json_output="--json" in sys.argv[1:]))
