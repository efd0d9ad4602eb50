"""What a load of runs cost, per turn and per run: the inputs of a fleet model
(``docs/fleet-model.md``).

Around a load driven by someone else (``bench.scale_load --costs``), it reads: the CPU of the
worker processes; of each Docker host's dockerd, containerd and the containerd shims of the
load's containers; of the containers themselves (the harness execs); the workers' resident
memory; a container's memory; the runs' Redis commands, CPU and memory, and their keys by
kind after the load; the broker's commands and messages. Each CPU and command figure is net
of the same processes' idle rate, read over an idle window before the load.

Processes are read from /proc (CPU: utime + stime + cutime + cstime, so that the short-lived
children a process reaps count as its own: runc and the harness execs for a shim); the
load's containers from their cgroups (v1 with cgroupfs, Docker's default here, ``/docker/<id>``
on both daemons; v2 as ``density_host`` finds it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis

from bench.density_host import container_cpu_seconds, container_memory
from bench.machine import busy_cpu_seconds
from bench.proc_status import memory_bytes
from sandbox.base import LABEL_SCOPE

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
DEFAULT_DOCKER_SOCKETS = {"unix:///var/run/docker.sock", "unix:///run/docker.sock"}
MS = 1000.0
MIB = 2**20


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of /proc/PID/stat, None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def _cpu(fields: list[str]) -> float:
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """The process's CPU with that of the children it has reaped; 0 once it is gone."""
    found = _stat(pid)
    return _cpu(found[1]) if found else 0.0


def rss_bytes(pid: int, field_name: str = "VmRSS") -> int:
    """VmRSS (or VmHWM) of a process, 0 once it is gone."""
    with contextlib.suppress(OSError, KeyError):
        return memory_bytes(field_name, pid)
    return 0


def _argv(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


def _option(argv: list[str], *names: str) -> list[str]:
    """Every value of the options ``names`` in ``argv`` (``-H x``, ``--host x``, ``--host=x``)."""
    values = []
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                values.append(argv[i + 1])
            elif arg.startswith(name + "="):
                values.append(arg.split("=", 1)[1])
    return values


@dataclass
class Daemon:
    """One host's dockerd, the containerd it started, and what its shims name as address."""

    host: str
    dockerd: int
    containerd: int | None
    state_dir: str | None
    data_root: Path


def find_daemons(hosts: Mapping[str, str | None]) -> dict[str, Daemon]:
    """Each host's dockerd (host name -> its Docker URL, None for the default socket), found
    by its -H."""
    found: dict[str, Daemon] = {}
    for pid in _pids():
        argv = _argv(pid)
        if not argv or Path(argv[0]).name != "dockerd":
            continue
        sockets = set(_option(argv, "-H", "--host"))
        for host, url in hosts.items():
            if url in sockets or (
                url is None and (not sockets or sockets & DEFAULT_DOCKER_SOCKETS)
            ):
                root = Path((_option(argv, "--data-root") or ["/var/lib/docker"])[0])
                found[host] = Daemon(host, pid, None, None, root)
    for pid in _pids():
        stat = _stat(pid)
        if not stat or stat[0] != "containerd":
            continue
        for daemon in found.values():
            if int(stat[1][1]) == daemon.dockerd:
                config = _option(_argv(pid), "--config", "-c")
                daemon.containerd = pid
                if config:
                    daemon.state_dir = os.path.realpath(os.path.dirname(config[0]))
    return found


def _cgroup(container_id: str) -> tuple[int | None, float | None]:
    """(memory, CPU seconds) of a container's cgroup; None for what is gone, as it can be
    between two reads while the container is removed."""
    held = inside = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        held = container_memory(container_id)
    with contextlib.suppress(OSError, ValueError, KeyError):
        inside = container_cpu_seconds(container_id)
    return held, inside


@dataclass
class Seen:
    """A process or cgroup the sampler follows: its counter when first and last seen."""

    host: str
    first: float
    last: float


class HostSampler:
    """Every ``interval_s`` on a thread of its own: the shims of the load's containers (CPU,
    resident memory), the containers' cgroups (CPU, memory), the daemons' memory. A shim or
    container that goes between two samples loses its last interval's CPU (an
    underestimate, small next to its life of several seconds)."""

    def __init__(self, daemons: dict[str, Daemon], scope: str, interval_s: float = 0.5) -> None:
        self.daemons, self.scope, self.interval_s = daemons, scope, interval_s
        self.shims: dict[int, Seen] = {}
        self.cgroups: dict[str, Seen] = {}
        self.peak_containers: dict[str, int] = {}
        self.memory_at_peak: dict[str, tuple[int, int]] = {}
        """host -> (shims' RSS, containers' memory) summed, at its peak count."""
        self.daemon_rss: dict[str, tuple[int, int]] = {}
        """host -> (dockerd + containerd RSS at the start, their peak)."""
        self._shim_of: dict[int, tuple[str, str] | None] = {}
        self._ours: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-sampler", daemon=True)
        self._started = False

    def _host_of_shim(self, pid: int) -> tuple[str, str] | None:
        """(host, container id) of a shim of one of the load's containers, else None."""
        if pid not in self._shim_of:
            argv, found = _argv(pid), None
            address, ids = _option(argv, "-address"), _option(argv, "-id")
            for daemon in self.daemons.values():
                if (
                    address
                    and ids
                    and os.path.realpath(os.path.dirname(address[0])) == daemon.state_dir
                ):
                    found = (daemon.host, ids[0]) if self._is_ours(daemon, ids[0]) else None
            self._shim_of[pid] = found
        return self._shim_of[pid]

    def _is_ours(self, daemon: Daemon, container_id: str) -> bool:
        if container_id not in self._ours:
            config = daemon.data_root / "containers" / container_id / "config.v2.json"
            labels: dict[str, str] = {}
            with contextlib.suppress(OSError, ValueError):
                labels = json.loads(config.read_text())["Config"].get("Labels") or {}
            self._ours[container_id] = labels.get(LABEL_SCOPE) == self.scope
        return self._ours[container_id]

    def tick(self) -> None:
        counts: Counter[str] = Counter()
        shim_rss: Counter[str] = Counter()
        memory: Counter[str] = Counter()
        for pid in _pids():
            stat = _stat(pid)
            if not stat or stat[0] != "containerd-shim" or stat[1][0] == "Z":
                continue
            placed = self._host_of_shim(pid)
            if placed is None:
                continue
            host, container_id = placed
            cpu = _cpu(stat[1])
            # A shim there before the load counts from then; a new one, from its start.
            seen = self.shims.setdefault(pid, Seen(host, cpu if not self._started else 0.0, cpu))
            seen.last = cpu
            counts[host] += 1
            shim_rss[host] += int(stat[1][21]) * PAGE_BYTES
            held, inside = _cgroup(container_id)
            memory[host] += held or 0
            if inside is not None:
                first = inside if not self._started else 0.0
                self.cgroups.setdefault(container_id, Seen(host, first, inside)).last = inside
        for host, n in counts.items():
            # At the peak count, the largest reading: a container being torn down reads 0.
            if n > self.peak_containers.get(host, 0):
                self.peak_containers[host] = n
                self.memory_at_peak[host] = (shim_rss[host], memory[host])
            elif n == self.peak_containers[host]:
                rss, held = self.memory_at_peak[host]
                self.memory_at_peak[host] = (max(rss, shim_rss[host]), max(held, memory[host]))
        for host, daemon in self.daemons.items():
            rss = rss_bytes(daemon.dockerd) + (
                rss_bytes(daemon.containerd) if daemon.containerd else 0
            )
            start, peak = self.daemon_rss.get(host, (rss, rss))
            self.daemon_rss[host] = (start, max(peak, rss))
        self._started = True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def start(self) -> None:
        self.tick()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.tick()

    def shim_cpu(self, host: str) -> float:
        return sum(s.last - s.first for s in self.shims.values() if s.host == host)

    def container_cpu(self, host: str) -> float:
        return sum(c.last - c.first for c in self.cgroups.values() if c.host == host)


@dataclass
class RedisCounters:
    """A Redis server's command counts and the microseconds it spent executing each
    (``INFO commandstats``: commands run inside scripts included, and inside the script's
    own), its CPU (the commands, and the network and event loop around them) and its
    memory."""

    calls: Counter[str]
    cpu_s: float
    used_memory: int
    usec: Counter[str] = field(default_factory=Counter)

    @classmethod
    def take(cls, url: str) -> RedisCounters:
        client = redis.Redis.from_url(url)
        try:
            stats: dict[str, dict[str, Any]] = client.info("commandstats")  # type: ignore[assignment]
            cpu: dict[str, Any] = client.info("cpu")  # type: ignore[assignment]
            memory = int(client.info("memory")["used_memory"])  # type: ignore[index]
        finally:
            client.close()
        calls = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
        usec = Counter({k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in stats.items()})
        cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        return cls(calls, cpu_s, memory, usec)

    def __sub__(self, other: RedisCounters) -> RedisCounters:
        calls, usec = Counter(self.calls), Counter(self.usec)
        calls.subtract(other.calls)
        usec.subtract(other.usec)
        return RedisCounters(
            calls, self.cpu_s - other.cpu_s, self.used_memory - other.used_memory, usec
        )


@dataclass
class Counters:
    """Everything the load's cost is read from, at one moment."""

    at: float
    workers: dict[int, float]
    daemons: dict[str, tuple[float, float]]
    """host -> (dockerd CPU, containerd CPU)."""
    runs_redis: RedisCounters
    broker_redis: RedisCounters | None
    machine_s: float
    this_process_s: float

    @classmethod
    def take(
        cls, workers: list[int], daemons: dict[str, Daemon], runs_url: str, broker_url: str | None
    ) -> Counters:
        times = os.times()
        return cls(
            time.monotonic(),
            {pid: cpu_seconds(pid) for pid in workers},
            {
                h: (cpu_seconds(d.dockerd), cpu_seconds(d.containerd) if d.containerd else 0.0)
                for h, d in daemons.items()
            },
            RedisCounters.take(runs_url),
            RedisCounters.take(broker_url) if broker_url else None,
            busy_cpu_seconds(),
            times.user + times.system,
        )


@dataclass
class Keys:
    """The runs' keys after the load: ``MEMORY USAGE`` summed by kind, keys counted by kind,
    and the entries of every run's event stream."""

    held: dict[str, int]
    counted: dict[str, int]
    entries: int


def redis_keys_by_kind(url: str, prefix: str) -> Keys:
    """``MEMORY USAGE`` (SAMPLES 0) of every key of ``prefix``, by kind: the part of a run
    key's name after the run id (``turn:*:...`` for a turn's, ``record`` for the run's own),
    ``fleet-wide`` for the rest."""
    client = redis.Redis.from_url(url, decode_responses=True)
    held: Counter[str] = Counter()
    counted: Counter[str] = Counter()
    entries = 0
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        sizes = pipe.execute()
        run_prefix = f"{prefix}:run:"
        for key, size in zip(keys, sizes, strict=True):
            if key.startswith(run_prefix):
                _, _, kind = key.removeprefix(run_prefix).partition(":")
                parts = kind.split(":")
                if parts[0] == "turn" and len(parts) > 2:
                    kind = "turn:*:" + ":".join(parts[2:])
                kind = kind or "record"
                if kind == "events":
                    entries += int(client.xlen(key))  # type: ignore[arg-type]
            else:
                kind = "fleet-wide"
            held[kind] += int(size or 0)
            counted[kind] += 1
    finally:
        client.close()
    return Keys(dict(held), dict(counted), entries)


class Load(Protocol):
    """What the costs are divided by: the driver's report of the load."""

    @property
    def runs(self) -> int: ...

    @property
    def turns(self) -> int: ...

    @property
    def runs_per_host(self) -> dict[str, int]: ...


@dataclass
class Costs:
    runs: int
    turns: int
    seconds: float
    idle_s: float
    figures: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str, text: str) -> None:
        self.figures[name] = value
        self.lines.append(f"{text}: {value:,.{3 if abs(value) < 10 else 1}f} {unit}")

    def net(self, load: float, idle: float) -> float:
        """What the load added: its window's delta less the idle window's rate over as long."""
        return load - idle / self.idle_s * self.seconds if self.idle_s > 0 else load


@dataclass
class Readings:
    """c0 -> c1: the idle window; c1 -> c2: the load."""

    c0: Counters
    c1: Counters
    c2: Counters
    rss_before: dict[int, int]
    rss_after: dict[int, tuple[int, int]]
    """pid -> (VmRSS, VmHWM) as the load ended."""
    sampler: HostSampler | None

    def net(self, costs: Costs, pick: Callable[[Counters], float]) -> float:
        return costs.net(pick(self.c2) - pick(self.c1), pick(self.c1) - pick(self.c0))


def _worker_costs(costs: Costs, r: Readings) -> None:
    def cpu_of(pid: int) -> Callable[[Counters], float]:
        return lambda c: c.workers[pid]

    worker_cpu = sum(r.net(costs, cpu_of(pid)) for pid in r.c0.workers)
    turns = max(costs.turns, 1)
    costs.add(
        "worker_cpu_ms_per_turn", worker_cpu / turns * MS, "ms", "worker processes' CPU per turn"
    )
    costs.add(
        "worker_cores",
        worker_cpu / costs.seconds,
        "cores",
        "  worker processes' CPU during the load",
    )
    pids = sorted(r.c0.workers)
    for pid in pids:
        rss, hwm = r.rss_after.get(pid, (0, 0))
        costs.lines.append(
            f"  worker {pid}: CPU {r.c2.workers[pid] - r.c1.workers[pid]:.1f} s; RSS "
            f"{r.rss_before.get(pid, 0) / MIB:.0f} MiB before, {rss / MIB:.0f} MiB after, "
            f"peak {hwm / MIB:.0f} MiB"
        )
    costs.figures["worker_rss_mib"] = [r.rss_before.get(p, 0) / MIB for p in pids]
    costs.figures["worker_hwm_mib"] = [r.rss_after.get(p, (0, 0))[1] / MIB for p in pids]


def _host_costs(costs: Costs, r: Readings, host: str, host_turns: float) -> float:
    """One Docker host's figures; returns its Docker CPU (daemons and shims, less the
    containers' own)."""
    if any(r.c2.daemons[host][i] < r.c1.daemons[host][i] for i in (0, 1)):
        costs.lines.append(f"host {host}: its dockerd or containerd went during the load")
        return 0.0
    dockerd = r.net(costs, lambda c: c.daemons[host][0])
    containerd = r.net(costs, lambda c: c.daemons[host][1])
    shims = r.sampler.shim_cpu(host) if r.sampler else 0.0
    inside = r.sampler.container_cpu(host) if r.sampler else 0.0
    per_turn = MS / max(host_turns, 1.0)
    costs.add(
        f"dockerd_ms_per_turn_{host}", dockerd * per_turn, "ms", f"host {host}: dockerd per turn"
    )
    costs.add(
        f"containerd_ms_per_turn_{host}",
        containerd * per_turn,
        "ms",
        f"host {host}: containerd per turn",
    )
    costs.add(
        f"shim_ms_per_turn_{host}",
        (shims - inside) * per_turn,
        "ms",
        f"host {host}: the containers' shims and runc per turn "
        "(less the harness execs they reaped)",
    )
    costs.add(
        f"container_ms_per_turn_{host}",
        inside * per_turn,
        "ms",
        f"host {host}: the containers' own CPU per turn (the harness execs)",
    )
    if r.sampler and host in r.sampler.peak_containers:
        n = r.sampler.peak_containers[host]
        shim_rss, memory = r.sampler.memory_at_peak[host]
        start, peak = r.sampler.daemon_rss.get(host, (0, 0))
        costs.add(
            f"peak_containers_{host}", n, "containers", f"host {host}: containers at once, peak"
        )
        costs.add(
            f"shim_rss_mib_{host}",
            shim_rss / n / MIB,
            "MiB",
            f"host {host}: a container's shim RSS",
        )
        costs.add(
            f"container_mib_{host}",
            memory / n / MIB,
            "MiB",
            f"host {host}: a container's cgroup memory (as docker stats)",
        )
        costs.add(
            f"daemon_rss_growth_mib_{host}",
            (peak - start) / MIB,
            "MiB",
            f"host {host}: dockerd + containerd RSS growth to the peak",
        )
    return dockerd + containerd + shims - inside


def _redis_costs(
    costs: Costs, name: str, label: str, load: RedisCounters, idle: RedisCounters
) -> None:
    turns = max(costs.turns, 1)
    calls = {c: costs.net(load.calls[c], idle.calls[c]) for c in load.calls}
    costs.add(
        f"{name}_commands_per_turn",
        sum(calls.values()) / turns,
        "commands",
        f"{label}: commands per turn (scripts' included)",
    )
    costs.figures[f"{name}_calls_per_turn"] = {
        c: n / turns for c, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n > 0
    }
    usec = {c: costs.net(load.usec[c], idle.usec[c]) for c in load.usec}
    costs.figures[f"{name}_usec_per_turn"] = {
        c: n / turns for c, n in sorted(usec.items(), key=lambda kv: -kv[1]) if n > 0
    }
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:10]
    costs.lines.append("  " + ", ".join(f"{c} {n / turns:.1f}" for c, n in top if n > 0))
    costs.add(
        f"{name}_cpu_ms_per_turn",
        costs.net(load.cpu_s, idle.cpu_s) / turns * MS,
        "ms",
        f"{label}: server CPU per turn",
    )
    costs.add(
        f"{name}_command_ms_per_turn",
        sum(usec.values()) / turns / MS,
        "ms",
        f"{label}: of which executing the commands (commandstats usec)",
    )
    costs.add(
        f"{name}_idle_commands_per_s",
        sum(idle.calls.values()) / max(costs.idle_s, 1e-9),
        "commands/s",
        f"{label}: commands per second idle (heartbeats, polls)",
    )


def _broker_costs(costs: Costs, r: Readings, shared: bool) -> None:
    """Broker messages: the list pushes and publishes of a Redis broker (kombu's sends, and
    Celery's task events)."""
    if r.c0.broker_redis and r.c1.broker_redis and r.c2.broker_redis:
        b0, b1, b2 = r.c0.broker_redis, r.c1.broker_redis, r.c2.broker_redis
        _redis_costs(costs, "broker", "broker's Redis", b2 - b1, b1 - b0)
    elif shared:
        b0, b1, b2 = r.c0.runs_redis, r.c1.runs_redis, r.c2.runs_redis
    else:
        costs.lines.append("broker messages per turn: not counted (not a Redis broker)")
        return
    messages = sum(
        costs.net(b2.calls[c] - b1.calls[c], b1.calls[c] - b0.calls[c])
        for c in ("lpush", "rpush", "publish")
    )
    costs.add(
        "broker_messages_per_turn",
        messages / max(costs.turns, 1),
        "messages",
        "broker messages per turn (LPUSH, RPUSH, PUBLISH)",
    )


def _key_costs(costs: Costs, keys: Keys, used_memory: int) -> None:
    runs = max(costs.runs, 1)
    costs.add(
        "redis_used_memory_per_run",
        used_memory / runs,
        "B",
        "runs' Redis used_memory growth per run (with the producers' connections' buffers)",
    )
    run_bytes = sum(v for k, v in keys.held.items() if k != "fleet-wide")
    costs.add(
        "redis_bytes_per_run", run_bytes / runs, "B", "runs' Redis: a run's keys after its end"
    )
    for kind in sorted(keys.held, key=lambda k: -keys.held[k]):
        costs.lines.append(
            f"  {kind}: {keys.held[kind] / runs:,.0f} B per run ({keys.counted[kind]} keys)"
        )
    costs.add(
        "events_per_turn",
        keys.entries / max(costs.turns, 1),
        "events",
        "events per turn in the streams",
    )


def costs_of(load: Load, r: Readings, keys: Keys, *, broker_shared: bool) -> Costs:
    """Every figure of the load, per turn and per run."""
    costs = Costs(load.runs, load.turns, r.c2.at - r.c1.at, r.c1.at - r.c0.at)
    _worker_costs(costs, r)
    turns_per_run = load.turns / max(load.runs, 1)
    docker_cpu = sum(
        _host_costs(costs, r, host, load.runs_per_host.get(host, 0) * turns_per_run)
        for host in sorted(r.c0.daemons)
    )
    costs.add(
        "docker_cpu_ms_per_turn",
        docker_cpu / max(load.turns, 1) * MS,
        "ms",
        "Docker's CPU per turn, every host (dockerd, containerd, shims, runc)",
    )
    label = "runs' and broker's Redis (one server)" if broker_shared else "runs' Redis"
    _redis_costs(
        costs,
        "runs_redis",
        label,
        r.c2.runs_redis - r.c1.runs_redis,
        r.c1.runs_redis - r.c0.runs_redis,
    )
    _broker_costs(costs, r, broker_shared)
    _key_costs(costs, keys, (r.c2.runs_redis - r.c1.runs_redis).used_memory)
    turns = max(load.turns, 1)
    busy = r.c2.machine_s - r.c1.machine_s
    costs.add(
        "load_process_ms_per_turn",
        (r.c2.this_process_s - r.c1.this_process_s) / turns * MS,
        "ms",
        "the load's own process (producers, checks, sampler) CPU per turn",
    )
    costs.add("machine_cores", busy / costs.seconds, "cores", "the machine's busy CPU (everyone's)")
    costs.add("machine_ms_per_turn", busy / turns * MS, "ms", "  per turn")
    return costs


L = TypeVar("L", bound=Load)


def measure_load(
    drive: Callable[[Callable[[], None]], L],
    *,
    workers: list[int],
    hosts: Mapping[str, str | None],
    scope: str,
    idle_s: float,
    runs_url: str,
    broker_url: str | None,
    broker_shared: bool,
) -> tuple[L, Costs]:
    """Run ``drive`` with its costs: an idle window of ``idle_s``, then the load, each
    between two readings of every counter. ``drive(on_done)`` runs the load and calls
    ``on_done`` as its last run has ended (before its own checks). ``workers``: the worker
    processes' pids; ``hosts``: host name -> Docker URL (None: the default socket);
    ``scope``: the containers' ``harness.scope`` label and the runs' key prefix.
    ``broker_url``: a Redis broker other than the runs' Redis (None for RabbitMQ, or when
    ``broker_shared``: the broker is the runs' Redis)."""
    daemons = find_daemons(hosts)
    sampler = HostSampler(daemons, scope) if daemons else None
    c0 = Counters.take(workers, daemons, runs_url, broker_url)
    time.sleep(idle_s)
    rss_before = {pid: rss_bytes(pid) for pid in workers}
    if sampler:
        sampler.start()
    c1 = Counters.take(workers, daemons, runs_url, broker_url)
    ended: list[Counters] = []
    rss_after: dict[int, tuple[int, int]] = {}

    def done() -> None:
        ended.append(Counters.take(workers, daemons, runs_url, broker_url))
        rss_after.update({pid: (rss_bytes(pid), rss_bytes(pid, "VmHWM")) for pid in workers})
        if sampler:
            sampler.stop()

    load = drive(done)
    if not ended:
        done()
    readings = Readings(c0, c1, ended[0], rss_before, rss_after, sampler)
    keys = redis_keys_by_kind(runs_url, scope)
    return load, costs_of(load, readings, keys, broker_shared=broker_shared)
