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
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker

from config import load_settings
from worker.client import HarnessClient

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

    def docker(self, host: Host) -> docker.DockerClient:
        if host.docker_url:
            return docker.DockerClient(base_url=host.docker_url)
        return docker.from_env()

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
    problems: list[str] = field(default_factory=list)
    turns_done: int = 0


def _drive_run(
    cluster: Cluster, turns: int, result: RunResult | None, out: list[RunResult]
) -> None:
    client = cluster.client()
    try:
        script = "@run hostname"
        submitted = time.monotonic()
        run_id = client.start_run("stdio-json", script, executable="harness-demo")
        result = RunResult(run_id)
        out.append(result)
        for turn in range(1, turns + 1):
            if turn > 1:
                submitted = time.monotonic()
                client.submit_turn(run_id, script)
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


@dataclass
class Report:
    runs: int
    turns: int
    seconds: float
    latencies: list[float]
    violations: list[str]
    leaked: int

    def lines(self) -> list[str]:
        ordered = sorted(self.latencies) or [0.0]
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        return [
            f"runs {self.runs} · turns {self.turns} in {self.seconds:.1f}s "
            f"· {self.turns / self.seconds:.1f} turns/s",
            f"submit → terminal: p50 {statistics.median(ordered) * 1000:.0f} ms "
            f"· p95 {p95 * 1000:.0f} ms",
            f"affinity violations: {len(self.violations)}"
            + "".join(f"\n  - {v}" for v in self.violations[:20]),
            f"containers left after end and a reaper pass: {self.leaked}",
        ]


def run_load(cluster: Cluster, runs: int, turns: int) -> Report:
    results: list[RunResult] = []
    threads = [
        threading.Thread(target=_drive_run, args=(cluster, turns, None, results))
        for _ in range(runs)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
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
    cluster.reap()
    leaked = len(cluster.containers())
    latencies = [x for r in results for x in r.latencies]
    return Report(runs, len(latencies), seconds, latencies, violations, leaked)


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
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "harness-load"
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = start_cluster(
        redis_url=args.redis,
        broker_url=args.broker or args.redis,
        workers_per_host=args.workers_per_host,
        concurrency=args.concurrency,
        workdir=workdir,
        second_host=not args.one_host,
    )
    try:
        report = run_load(cluster, args.runs, args.turns)
    finally:
        cluster.stop()
    hosts = len(cluster.hosts)
    print(
        f"{hosts} Docker hosts · {hosts * args.workers_per_host} worker processes "
        f"· concurrency {args.concurrency} each · broker {args.broker or 'redis'}"
    )
    for line in report.lines():
        print(line)
    return 1 if report.violations or report.leaked else 0


if __name__ == "__main__":
    sys.exit(main())
