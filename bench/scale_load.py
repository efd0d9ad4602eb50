"""Load across several worker processes on several Docker hosts, checking run affinity.

    python -m bench.scale_load --runs 24 --turns 3 --workers-per-host 2 [--broker amqp://...]

Starts its own workers (an isolated key prefix; host ``a`` is the local dockerd, host ``b``
the second daemon of ``scripts/second-dockerd``), drives N runs x M turns of the demo harness
in containers, and prints turns per second, p50/p95 of submit → terminal, and any affinity
violation: a run whose turns did not all run in its one container, a turn without exactly
one terminal, a container left after ``end`` and a reaper pass.
"""

from __future__ import annotations

import argparse
import os
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
        env = {
            **self.env,
            "HARNESS_HOST_QUEUE": f"{self.prefix}.host.{host.name}",
            "HARNESS_WORKSPACE_ROOT": str(self.workdir / f"host-{host.name}"),
        }
        if host.docker_url:
            env["HARNESS_DOCKER_URL"] = host.docker_url
        return env

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
                env={**os.environ, **self.host_env(host)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def client(self) -> HarnessClient:
        values = {k.removeprefix("HARNESS_").lower(): v for k, v in self.env.items()}
        return HarnessClient(load_settings(**values))

    def containers(self) -> list[object]:
        found: list[object] = []
        for host in self.hosts:
            api = (
                docker.DockerClient(base_url=host.docker_url)
                if host.docker_url
                else docker.from_env()
            )
            found += api.containers.list(
                all=True,
                filters={"label": ["harness.managed=true", f"harness.scope={self.prefix}"]},
            )
        return found

    def reap(self) -> list[str]:
        """One reaper pass per host; returns what it removed. Raises with the CLI's stderr."""
        removed: list[str] = []
        for host in self.hosts:
            done = subprocess.run(
                [sys.executable, "-m", "worker.cli", "reap"],
                cwd=REPO,
                timeout=300,
                capture_output=True,
                env={**os.environ, **self.host_env(host)},
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
    client = cluster.client()
    deadline = time.monotonic() + 120
    wanted = {f"{prefix}.host.{h.name}" for h in hosts}
    while time.monotonic() < deadline:
        if wanted <= set(client.redis.hkeys(client.keys.hosts())):
            break
        time.sleep(0.2)
    else:
        cluster.stop()
        raise RuntimeError("workers did not start: see " + ", ".join(map(str, cluster.logs)))
    time.sleep(1.0)  # let every worker of a host subscribe, not only the first
    client.close()
    return cluster


@dataclass
class RunResult:
    run_id: str
    containers: set[str] = field(default_factory=set)
    hostnames: set[str] = field(default_factory=set)
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
            container = client.status(run_id).get("container_id")
            if container:
                result.containers.add(container)
            result.turns_done += 1
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
    for result in results:
        violations += [f"{result.run_id}: {p}" for p in result.problems]
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
