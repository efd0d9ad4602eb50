"""Load across several worker processes on several Docker hosts, checking run affinity.

    python -m bench.scale_load --runs 24 --turns 3 --workers-per-host 2 [--broker amqp://...]

Starts its own workers (an isolated key prefix; host ``a`` is the local dockerd, host ``b``
the second daemon of ``scripts/second-dockerd``), drives N runs x M turns of the demo harness
in containers, and prints turns per second, p50/p95 of submit → terminal, and any affinity
violation: a run whose turns did not all run in its one container, a turn without exactly
one terminal, a container left after ``end`` and a reaper pass.

The workers keep their default host queues: each names its Docker daemon
(``<prefix>.host.docker.<daemon ID>``), so the workers of one daemon share one queue and
the two daemons' workers never do. A worker is ready once its own heartbeat key
(``<prefix>:worker:<hostname>:<pid>``) is there.

It prints as well each run's first turn apart from its later ones and the runs each host
took. With ``--costs`` it also measures what the load cost, per turn and per run
(``bench.load_costs``: worker, Docker, container, Redis and broker figures, net of an idle
window of ``--idle-s`` before the load), the inputs of ``docs/fleet-model.md``.
``--own-redis`` puts the runs and the broker on a redis-server each of this command's own, so
that their figures are the load's alone; ``--json PATH`` writes every figure.

    python -m bench.scale_load --runs 100 --turns 3 --costs --own-redis --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from docker.client import DockerClient, from_env

from bench.load_costs import Costs, measure_load
from bench.private_redis import PrivateRedis
from config import load_settings
from worker.client import HarnessClient
from worker.errors import RunEnded

REPO = Path(__file__).resolve().parent.parent
SECOND_DOCKERD = "unix:///run/harness-docker2.sock"
DEMO_IMAGE = "harness-worker/demo:1"


def _environ() -> dict[str, str]:
    """This process's environment without a host queue override: workers keep the default."""
    return {k: v for k, v in os.environ.items() if k != "HARNESS_HOST_QUEUE"}


@dataclass
class Host:
    name: str
    docker_url: str | None


@dataclass
class Cluster:
    prefix: str
    env: dict[str, str]
    hosts: list[Host]
    workdir: Path = Path("/tmp")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def host_env(self, host: Host) -> dict[str, str]:
        """A worker's environment on ``host``: no HARNESS_HOST_QUEUE (the default names the
        daemon), its own workspace root (as on another machine)."""
        env = {**self.env, "HARNESS_WORKSPACE_ROOT": str(self.workspace_root(host))}
        if host.docker_url:
            env["HARNESS_DOCKER_URL"] = host.docker_url
        return env

    def workspace_root(self, host: Host) -> Path:
        return self.workdir / f"host-{host.name}"

    def docker(self, host: Host) -> DockerClient:
        if host.docker_url:
            return DockerClient(base_url=host.docker_url)
        return from_env()

    def host_queue(self, host: Host) -> str:
        """The queue a worker on ``host`` consumes by default: it names the Docker daemon."""
        from sandbox.identity import docker_location

        return f"{self.prefix}.host.{docker_location(host.docker_url)}"

    @staticmethod
    def worker_id(proc: subprocess.Popen[bytes]) -> str:
        """The id a worker process announces itself by (``worker.runtime``: host:pid)."""
        return f"{socket.gethostname()}:{proc.pid}"

    def wait_ready(self, procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
        """Wait until every one of ``procs`` beats under its own id (so consumes its queues)."""
        client = self.client()
        try:
            waiting = list(procs)
            deadline = time.monotonic() + timeout
            while waiting and time.monotonic() < deadline:
                for proc in list(waiting):
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"worker {proc.pid} exited at start: see "
                            + ", ".join(map(str, self.logs))
                        )
                    if client.redis.exists(client.keys.worker_alive(self.worker_id(proc))):
                        waiting.remove(proc)
                if waiting:
                    time.sleep(0.1)
            if waiting:
                raise RuntimeError(
                    f"{len(waiting)} workers did not start: see " + ", ".join(map(str, self.logs))
                )
        finally:
            client.close()

    def spawn(self, host: Host, index: int) -> subprocess.Popen[bytes]:
        """Start one worker process on ``host`` (appending to its log across restarts)."""
        log = self.workdir / f"{self.prefix}-{host.name}{index}.log"
        if log not in self.logs:
            self.logs.append(log)
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "worker",
            "-l",
            "info",
            "-n",
            f"{host.name}{index}-{self.prefix}@%h",
            "--without-mingle",
            "--without-gossip",
        ]
        with log.open("ab") as out:
            return subprocess.Popen(
                command,
                cwd=REPO,
                env={**_environ(), **self.host_env(host)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def client(self) -> HarnessClient:
        values = {k.removeprefix("HARNESS_").lower(): v for k, v in self.env.items()}
        return HarnessClient(load_settings(**values))

    def containers(self) -> list[object]:
        found: list[object] = []
        for host in self.hosts:
            api = self.docker(host)
            try:
                found += api.containers.list(
                    all=True,
                    filters={"label": ["harness.managed=true", f"harness.scope={self.prefix}"]},
                )
            finally:
                api.close()
        return found

    def placements(self, run_id: str) -> list[tuple[str, str]]:
        """Every container of ``run_id`` (by its labels), as (host name, container id)."""
        labels = [f"harness.scope={self.prefix}", f"harness.run_id={run_id}"]
        found = []
        for host in self.hosts:
            api = self.docker(host)
            try:
                for container in api.containers.list(all=True, filters={"label": labels}):
                    found.append((host.name, str(container.id)))
            finally:
                api.close()
        return found

    def placed_on(self, run_id: str) -> list[str]:
        """The hosts on which a container of ``run_id`` exists."""
        return [host for host, _ in self.placements(run_id)]

    def reap(self) -> list[str]:
        """One reaper pass per host; returns what it removed. Raises with the CLI's stderr."""
        removed: list[str] = []
        for host in self.hosts:
            done = subprocess.run(
                [sys.executable, "-m", "worker.cli", "reap"],
                cwd=REPO,
                timeout=300,
                capture_output=True,
                env={**_environ(), **self.host_env(host)},
            )
            if done.returncode != 0:
                raise RuntimeError(f"harness reap failed: {done.stderr.decode()[-2000:]}")
            removed += done.stdout.decode().splitlines()
        return removed

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_cluster(
    *,
    redis_url: str,
    broker_url: str,
    workers_per_host: int,
    concurrency: int,
    workdir: Path,
    second_host: bool = True,
    extra_env: dict[str, str] | None = None,
) -> Cluster:
    prefix = "load" + uuid.uuid4().hex[:8]
    hosts = [Host("a", None)]
    if second_host:
        subprocess.run(
            [str(REPO / "scripts" / "second-dockerd"), DEMO_IMAGE],
            check=True,
            capture_output=True,
            timeout=600,
        )
        hosts.append(Host("b", SECOND_DOCKERD))
    env = {
        "HARNESS_REDIS_URL": redis_url,
        "HARNESS_BROKER_URL": broker_url,
        "HARNESS_KEY_PREFIX": prefix,
        "HARNESS_SANDBOX": "docker",
        "HARNESS_NETWORK": "none",
        "HARNESS_CONCURRENCY": str(concurrency),
        "HARNESS_METRICS_PORT": "0",
        **(extra_env or {}),
    }
    cluster = Cluster(prefix, env, hosts, workdir=workdir)
    for host in hosts:
        for index in range(workers_per_host):
            cluster.processes.append(cluster.spawn(host, index))
    try:
        cluster.wait_ready(cluster.processes)
    except RuntimeError:
        cluster.stop()
        raise
    return cluster


@dataclass
class RunResult:
    run_id: str
    containers: set[str] = field(default_factory=set)
    hostnames: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    placed_on: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    in_flight: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    turns_done: int = 0


def script_of(turn_s: float) -> str:
    """A turn's demo script: wait ``turn_s`` (as a CLI waits on its model), then say which
    container it ran in."""
    return f"@sleep {turn_s:g}\n@run hostname" if turn_s > 0 else "@run hostname"


def _drive_run(
    cluster: Cluster, turns: int, out: list[RunResult], script: str = "@run hostname"
) -> None:
    client = cluster.client()
    try:
        submitted, sent = time.monotonic(), time.time()
        run_id = client.start_run("stdio-json", script, executable="harness-demo")
        result = RunResult(run_id)
        out.append(result)
        for turn in range(1, turns + 1):
            if turn > 1:
                submitted, sent = time.monotonic(), time.time()
                try:
                    client.submit_turn(run_id, script)
                except RunEnded as ended:  # an earlier turn failed the run (its daemon went)
                    result.problems.append(f"turn {turn}: not taken: {ended}")
                    break
            terminal = client.wait(run_id, turn, timeout=300)
            result.latencies.append(time.monotonic() - submitted)
            events = [
                e
                for e in client.events(
                    run_id, after=f"{turn - 1}-18446744073709551615" if turn > 1 else None
                )
                if e.turn == turn
            ]
            terminals = [e for e in events if e.terminal]
            if len(terminals) != 1 or not events[-1].terminal:
                result.problems.append(f"turn {turn}: {len(terminals)} terminal events")
            if terminal.type != "turn-complete":
                result.problems.append(f"turn {turn}: {terminal.data}")
                continue
            # The publisher's clock (this machine's): sent -> turn-started -> terminal.
            began = next((e.ts for e in events if e.type == "turn-started"), None)
            if began is not None:
                result.queued.append(began - sent)
                result.in_flight.append(events[-1].ts - began)
            texts = [e.data["text"] for e in events if e.type == "assistant-text"]
            result.hostnames.update(t for t in texts if t)
            record = client.status(run_id)
            if record.get("container_id"):
                result.containers.add(record["container_id"])
            if record.get("queue"):
                result.queues.add(record["queue"])
            result.turns_done += 1
        result.placed_on = cluster.placed_on(run_id)
        client.end(run_id)
    finally:
        client.close()


def _percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p95) of ``values``, 0 for none."""
    ordered = sorted(values) or [0.0]
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


@dataclass
class Report:
    runs: int
    turns: int
    seconds: float
    latencies: list[float]
    violations: list[str]
    leaked: int
    first_turns: list[float] = field(default_factory=list)
    """Submit → terminal of each run's first turn (the container's create and start in it)."""
    later_turns: list[float] = field(default_factory=list)
    runs_per_host: dict[str, int] = field(default_factory=dict)
    queued: list[float] = field(default_factory=list)
    """Each turn's submit -> ``turn-started`` (the broker, a free slot, the claim)."""
    in_flight: list[float] = field(default_factory=list)
    """Each turn's ``turn-started`` -> terminal, as published (the worker holds it)."""

    def lines(self) -> list[str]:
        p50, p95 = _percentiles(self.latencies)
        first = _percentiles(self.first_turns)
        later = _percentiles(self.later_turns)
        queued, held = _percentiles(self.queued), _percentiles(self.in_flight)
        hosts = " · ".join(f"host {h} {n}" for h, n in sorted(self.runs_per_host.items()))
        return [
            f"runs {self.runs} · turns {self.turns} in {self.seconds:.1f}s "
            f"· {self.turns / self.seconds:.1f} turns/s",
            f"submit → terminal: p50 {p50 * 1000:.0f} ms · p95 {p95 * 1000:.0f} ms",
            f"  first turns: p50 {first[0] * 1000:.0f} ms · p95 {first[1] * 1000:.0f} ms; "
            f"later turns: p50 {later[0] * 1000:.0f} ms · p95 {later[1] * 1000:.0f} ms",
            f"  queued (submit → turn-started): p50 {queued[0] * 1000:.0f} ms · p95 "
            f"{queued[1] * 1000:.0f} ms; in flight (turn-started → terminal): p50 "
            f"{held[0] * 1000:.0f} ms · p95 {held[1] * 1000:.0f} ms · "
            f"{sum(self.in_flight):.0f} turn-seconds",
            f"runs (containers) per host: {hosts or 'none'}",
            f"affinity violations: {len(self.violations)}"
            + "".join(f"\n  - {v}" for v in self.violations[:20]),
            f"containers left after end and a reaper pass: {self.leaked}",
        ]


def run_load(
    cluster: Cluster,
    runs: int,
    turns: int,
    on_done: Callable[[], None] | None = None,
    *,
    turn_s: float = 0.0,
) -> Report:
    """Drive the load: ``runs`` at once, each of ``turns`` turns one after the other, each
    turn holding its harness ``turn_s`` before it answers. ``on_done`` is called as the last
    run has ended, before the checks and the reaper pass (the end of a measured window)."""
    results: list[RunResult] = []
    script = script_of(turn_s)
    threads = [
        threading.Thread(target=_drive_run, args=(cluster, turns, results, script))
        for _ in range(runs)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    if on_done:
        on_done()
    violations: list[str] = []
    queues = {cluster.host_queue(host): host.name for host in cluster.hosts}
    if len(queues) != len(cluster.hosts):
        violations.append(f"two Docker daemons share a host queue: {sorted(queues)}")
    for result in results:
        violations += [f"{result.run_id}: {p}" for p in result.problems]
        # The run's queue names the daemon its container is on.
        hosts = [queues.get(q, f"unknown queue {q}") for q in sorted(result.queues)]
        if hosts != result.placed_on:
            violations.append(
                f"{result.run_id}: routed to {hosts or 'no host queue'}, "
                f"container on {result.placed_on or 'no host'}"
            )
        if len(result.containers) != 1 or len(result.hostnames) != 1:
            violations.append(
                f"{result.run_id}: turns ran in {len(result.hostnames)} containers "
                f"({len(result.containers)} recorded)"
            )
        if result.turns_done != turns:
            violations.append(f"{result.run_id}: {result.turns_done}/{turns} turns completed")
    if len(results) != runs:
        violations.append(f"only {len(results)} of {runs} runs started")
    try:
        cluster.reap()
    except RuntimeError as failed:  # reported with the rest, not instead of it
        violations.append(str(failed)[-500:])
    leaked = len(cluster.containers())
    latencies = [x for r in results for x in r.latencies]
    return Report(
        runs,
        len(latencies),
        seconds,
        latencies,
        violations,
        leaked,
        first_turns=[r.latencies[0] for r in results if r.latencies],
        later_turns=[x for r in results for x in r.latencies[1:]],
        runs_per_host=dict(Counter(h for r in results for h in r.placed_on)),
        queued=[x for r in results for x in r.queued],
        in_flight=[x for r in results for x in r.in_flight],
    )


def _own_redis(directory: Path) -> PrivateRedis:
    directory.mkdir(parents=True, exist_ok=True)
    server = PrivateRedis(directory, append_only=False)
    server.start()
    return server


def _drive(cluster: Cluster, args: argparse.Namespace, broker: str) -> tuple[Report, Costs | None]:
    if not args.costs:
        return run_load(cluster, args.runs, args.turns, turn_s=args.turn_s), None
    return measure_load(
        lambda on_done: run_load(
            cluster, args.runs, args.turns, on_done=on_done, turn_s=args.turn_s
        ),
        workers=[proc.pid for proc in cluster.processes],
        hosts={host.name: host.docker_url for host in cluster.hosts},
        scope=cluster.prefix,
        idle_s=args.idle_s,
        runs_url=args.redis,
        broker_url=broker if broker.startswith("redis") and broker != args.redis else None,
        broker_shared=broker == args.redis,
    )


def _figures(report: Report, costs: Costs | None) -> dict[str, object]:
    p50, p95 = _percentiles(report.latencies)
    return {
        **(costs.figures if costs else {}),
        "runs": report.runs,
        "turns": report.turns,
        "seconds": report.seconds,
        "turns_per_s": report.turns / report.seconds,
        "p50_ms": p50 * 1000,
        "p95_ms": p95 * 1000,
        "first_p50_ms": _percentiles(report.first_turns)[0] * 1000,
        "later_p50_ms": _percentiles(report.later_turns)[0] * 1000,
        "queued_p50_ms": _percentiles(report.queued)[0] * 1000,
        "in_flight_p50_ms": _percentiles(report.in_flight)[0] * 1000,
        "in_flight_s_per_turn": sum(report.in_flight) / max(len(report.in_flight), 1),
        "queued_s_per_turn": sum(report.queued) / max(len(report.queued), 1),
        "runs_per_host": report.runs_per_host,
        "violations": len(report.violations),
        "leaked": report.leaked,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--redis", default=os.environ.get("HARNESS_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--broker", default=None, help="default: the Redis URL")
    parser.add_argument("--one-host", action="store_true", help="no second Docker daemon")
    parser.add_argument(
        "--turn-s",
        type=float,
        default=0.0,
        help="each turn's harness waits this long before it answers (a CLI waiting on its model)",
    )
    parser.add_argument(
        "--costs", action="store_true", help="also measure what the load cost (bench.load_costs)"
    )
    parser.add_argument(
        "--idle-s", type=float, default=10.0, help="with --costs: the idle window before the load"
    )
    parser.add_argument(
        "--own-redis",
        action="store_true",
        help="the runs (and, without --broker, the broker) on redis-servers of this command's "
        "own, so that their commands, CPU and memory are the load's alone",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "harness-load"
    workdir.mkdir(parents=True, exist_ok=True)
    servers: list[PrivateRedis] = []
    try:
        if args.own_redis:
            servers.append(_own_redis(workdir / "redis-runs"))
            args.redis = servers[0].url
            if args.broker is None:
                servers.append(_own_redis(workdir / "redis-broker"))
                args.broker = servers[1].url
        broker = args.broker or args.redis
        cluster = start_cluster(
            redis_url=args.redis,
            broker_url=broker,
            workers_per_host=args.workers_per_host,
            concurrency=args.concurrency,
            workdir=workdir,
            second_host=not args.one_host,
        )
        try:
            report, costs = _drive(cluster, args, broker)
        finally:
            cluster.stop()
    finally:
        for server in servers:
            server.stop()
    hosts = len(cluster.hosts)
    print(
        f"{hosts} Docker hosts · {hosts * args.workers_per_host} worker processes "
        f"· concurrency {args.concurrency} each · broker {args.broker or 'redis'}"
    )
    for line in report.lines():
        print(line)
    if costs:
        print(f"costs (net of the idle rate over {costs.idle_s:.1f} s before the load):")
        for line in costs.lines:
            print("  " + line)
    if args.json:
        figures = {
            **_figures(report, costs),
            "hosts": hosts,
            "workers_per_host": args.workers_per_host,
            "concurrency": args.concurrency,
            "turn_s": args.turn_s,
        }
        args.json.write_text(json.dumps(figures, indent=1))
    return 1 if report.violations or report.leaked else 0


if __name__ == "__main__":
    sys.exit(main())
