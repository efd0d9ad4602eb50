"""Soak: many turns over several worker processes while faults are injected at random.

    python -m bench.soak --turns 200 [--workers 3] [--seed 7]

Every turn runs the demo harness in a Docker container. Faults, picked at random per turn:
a cancel mid-turn, a harness that exits without a terminal line, a harness error, a turn
timeout, a worker SIGKILLed or SIGTERMed mid-turn (and restarted), and a restart of the Redis
that holds the streams (a private redis-server with an append-only file). Afterwards every
run is ended and a reaper pass runs; then it prints: turns, faults by kind, leaked containers,
live credentials, turns without exactly one terminal, and turns with duplicate or missing
events. Exit status 1 when any of those is not zero.

No beat and no reaper call during the load: a killed worker's turn is closed ``worker-lost``
by the workers' own reaper passes (every ``HARNESS_REAP_INTERVAL_S``), and neither that nor
a warm shutdown costs the run anything: its next turn runs in the same container, and a run
found ``failed`` after one is a problem.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos import owner_pid
from bench.private_redis import PrivateRedis
from bench.scale_load import Cluster, start_cluster
from bench.worker import signal_and_wait
from worker.client import HarnessClient, StreamEvent

LINES = 8
TURN_TIMEOUT_S = 12.0
SCRIPTS = {
    "none": f"@stream {LINES} 0.05",
    "cancel": "@text started\n@sleep 30",
    "exit": "@text started\n@exit 3",
    "error": "@text started\n@error scripted failure",
    "timeout": "@text started\n@sleep 30",
    "worker-kill": "@text started\n@sleep 30",
    "worker-term": "@text started\n@sleep 30",
    "redis-restart": f"@stream {LINES} 0.25",
}
EXPECTED_REASON = {
    "cancel": {"cancelled"},
    "exit": {"exit"},
    "error": {"harness-error"},
    "timeout": {"timeout"},
    # A concurrent fault on the same worker may take the turn down the other way first.
    "worker-kill": {"worker-lost", "shutdown"},
    "worker-term": {"shutdown", "worker-lost"},
}
WEIGHTS = {
    "none": 60,
    "cancel": 8,
    "exit": 6,
    "error": 6,
    "timeout": 6,
    "worker-kill": 5,
    "worker-term": 5,
    "redis-restart": 4,
}


@dataclass
class Soak:
    cluster: Cluster
    store: PrivateRedis
    rng: random.Random
    kinds: frozenset[str] = frozenset(WEIGHTS)
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    turns_done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker_lock: threading.Lock = field(default_factory=threading.Lock)

    def pick(self) -> str:
        with self.lock:
            chosen = {k: w for k, w in WEIGHTS.items() if k in self.kinds}
            kinds, weights = zip(*chosen.items(), strict=True)
            return self.rng.choices(kinds, weights)[0]

    def restart_a_worker(self, sig: signal.Signals) -> None:
        with self.worker_lock:
            index = self.rng.randrange(len(self.cluster.processes))
            signal_and_wait(self.cluster.processes[index], sig)
            self.cluster.processes[index] = self.cluster.spawn(self.cluster.hosts[0], index)

    def kill_busy_worker(
        self, client: HarnessClient, run_id: str, sig: signal.Signals
    ) -> float | None:
        """Signal the worker process running this run's turn (found by its heartbeat); the
        time it was signalled, or None when no live worker held the turn (another fault had
        already ended it, or its owner could not be read for 5 s)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.worker_lock, self.store.gate.shared():
                record = client.status(run_id)
                pid = owner_pid(
                    client.redis.get(client.keys.turn_owner(run_id, record["current_turn"]))
                )
                for index, proc in enumerate(self.cluster.processes):
                    if proc.pid == pid and proc.poll() is None:
                        sent_at = time.time()
                        signal_and_wait(proc, sig)
                        self.cluster.processes[index] = self.cluster.spawn(
                            self.cluster.hosts[0], index
                        )
                        return sent_at
            time.sleep(0.2)
        return None

    def one_turn(self, client: HarnessClient, run_id: str | None, turn: int) -> str:
        kind = self.pick()
        script = SCRIPTS[kind]
        with self.store.gate.shared():
            if run_id is None:
                # Every scripted turn but "timeout" ends well within the turn timeout.
                run_id = client.start_run(
                    "stdio-json", script, executable="harness-demo", timeout_s=TURN_TIMEOUT_S
                )
            else:
                client.submit_turn(run_id, script)
        fault_at: float | None = None
        if kind in ("cancel", "worker-kill", "worker-term"):
            self._wait_for_text(client, run_id, turn)
            if kind == "cancel":
                with self.store.gate.shared():
                    fault_at = time.time()
                    client.cancel(run_id)
            else:
                sig = signal.SIGKILL if kind == "worker-kill" else signal.SIGTERM
                fault_at = self.kill_busy_worker(client, run_id, sig)
        elif kind == "redis-restart":
            self._wait_for_text(client, run_id, turn)
            self.store.restart()
        terminal = self._wait(client, run_id, turn)
        with self.lock:
            self.faults[kind] += 1
            self.turns_done += 1
        self.check(client, run_id, turn, kind, terminal, fault_at)
        if terminal.get("reason") in ("worker-lost", "shutdown"):
            # A lost worker or a warm shutdown leaves the run usable, its container kept.
            with self.store.gate.shared():
                record = client.status(run_id)
            if record["status"] == "failed":
                self.problems.append(
                    f"{run_id}/{turn} ({kind}): {terminal['reason']} failed the run: "
                    f"{record.get('last_error')}"
                )
        return run_id

    def _wait_for_text(self, client: HarnessClient, run_id: str, turn: int) -> None:
        after = "0-0" if turn == 1 else f"{turn - 1}-18446744073709551615"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                for event in client.events(run_id, after=after, follow=True, timeout=5):
                    if event.turn == turn and (event.type == "assistant-text" or event.terminal):
                        return
            except Exception:  # noqa: BLE001 -- Redis restarting under another thread
                time.sleep(0.5)
        self.problems.append(f"{run_id}/{turn}: never produced text")

    def _wait(self, client: HarnessClient, run_id: str, turn: int) -> dict[str, object]:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            try:
                # A killed worker's turn is closed by the workers' own reaper passes.
                event = client.wait(run_id, turn, timeout=5)
                return {"type": event.type, **event.data}
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 -- Redis restarting under another thread
                time.sleep(0.5)
        self.problems.append(f"{run_id}/{turn}: no terminal within 150 s")
        return {}

    def check(
        self,
        client: HarnessClient,
        run_id: str,
        turn: int,
        kind: str,
        terminal: dict[str, object],
        fault_at: float | None = None,
    ) -> None:
        for _ in range(20):
            try:
                events = [e for e in client.events(run_id) if e.turn == turn]
                break
            except Exception:  # noqa: BLE001 -- Redis restarting under another thread
                time.sleep(0.5)
        else:
            self.problems.append(f"{run_id}/{turn}: could not read events")
            return
        where = f"{run_id}/{turn} ({kind})"
        if terminal.get("reason") in ("worker-lost", "shutdown") and not kind.startswith("worker-"):
            # Another turn's worker fault took this turn down with it: one terminal still.
            with self.lock:
                self.faults["collateral"] += 1
            kind = "collateral"
        if [e.seq for e in events] != list(range(len(events))):
            self.problems.append(f"{where}: ids not contiguous")
        if [e.terminal for e in events].count(True) != 1 or not events[-1].terminal:
            self.problems.append(f"{where}: {[e.terminal for e in events].count(True)} terminals")
        if [e.type for e in events].count("turn-started") != 1:
            self.problems.append(f"{where}: duplicate turn-started")
        if [e.type for e in events].count("session") > 1:
            self.problems.append(f"{where}: the harness ran more than once")
        expected = EXPECTED_REASON.get(kind)
        faulted = kind in ("cancel", "worker-kill", "worker-term")
        late = fault_at is not None and fault_at - events[0].ts >= TURN_TIMEOUT_S - 1.5
        if faulted and (late or fault_at is None) and expected:
            # Faults on other threads (a Redis restart) held this one back until the turn had
            # all but timed out, or no worker held the turn to signal: its script sleeps past
            # the turn timeout, so timing out is right too.
            expected = expected | {"timeout"}
        if expected and terminal.get("reason") not in expected:
            sent = (
                ", no fault sent (no live worker held the turn)"
                if fault_at is None
                else f", fault sent {fault_at - events[0].ts:.1f} s in"
            )
            self.problems.append(
                f"{where}: ended {terminal.get('type')} {terminal.get('reason')}{sent}; "
                + _what_happened(events, terminal)
            )
        if kind in ("none", "redis-restart"):
            texts = [e.data["text"] for e in events if e.type == "assistant-text"]
            if terminal.get("type") != "turn-complete" or texts != [
                f"line {i}" for i in range(LINES)
            ]:
                self.problems.append(f"{where}: missing or duplicate events: {texts}")

    def run_worker(self, budget: list[int]) -> None:
        client = self.cluster.client()
        run_id: str | None = None
        turn = 0
        containers: set[str] = set()
        try:
            while True:
                with self.lock:
                    if budget[0] <= 0:
                        break
                    budget[0] -= 1
                turn += 1
                try:
                    run_id = self.one_turn(client, run_id, turn)
                except Exception as exc:  # noqa: BLE001 -- report, start a fresh run
                    self.problems.append(f"{run_id}/{turn}: {type(exc).__name__}: {exc}")
                    run_id, turn, containers = None, 0, set()
                    continue
                with self.store.gate.shared():
                    record = client.status(run_id)
                    status = record["status"]
                    # Whatever the turn met, the run's turns share its one container.
                    if record.get("container_id"):
                        containers.add(record["container_id"])
                    if len(containers) > 1:
                        self.problems.append(
                            f"{run_id}/{turn}: the run's container changed: {sorted(containers)}"
                        )
                        containers = {record["container_id"]}
                    if status in ("failed", "ended") or self.rng.random() < 0.25:
                        if status not in ("failed", "ended"):
                            client.end(run_id)
                        run_id, turn = None, 0
                        containers = set()
            if run_id:
                with self.store.gate.shared():
                    client.end(run_id)
        finally:
            client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=8, help="runs driven at once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--broker", default=os.environ.get("HARNESS_BROKER_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    report = soak(args.turns, args.workers, args.parallel, args.seed, args.broker)
    for line in report["lines"]:
        print(line)
    return 0 if report["ok"] else 1


def _what_happened(events: list[StreamEvent], terminal: dict[str, object]) -> str:
    """A turn that ended the wrong way, as a problem line tells it: its events with their
    times, and what its terminal said (so one failure in CI can be read without a rerun)."""
    start = events[0].ts if events else 0.0
    steps = ", ".join(f"{e.type} +{e.ts - start:.2f}s" for e in events)
    tail = str(terminal.get("stderr_tail") or "")[-400:]
    return (
        f"events: {steps}; exit code {terminal.get('exit_code')}; "
        f"error: {terminal.get('error')!r}; stderr: {tail!r}"
    )


def _is_event_problem(problem: str) -> bool:
    return any(word in problem for word in ("missing", "duplicate", "more than once"))


def soak(
    turns: int,
    workers: int,
    parallel: int,
    seed: int,
    broker: str,
    kinds: frozenset[str] = frozenset(WEIGHTS),
) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="harness-soak-"))
    (workdir / "redis").mkdir()
    store = PrivateRedis(workdir / "redis")
    store.start()
    cluster = start_cluster(
        redis_url=store.url,
        broker_url=broker,
        workers_per_host=workers,
        concurrency=8,
        workdir=workdir,
        second_host=False,
        # A worker killed while it holds a delivered but not yet started turn leaves that
        # message unacknowledged until the broker's visibility timeout. Production sets it
        # above the longest turn; the soak sets it short, which the redelivery guard makes
        # safe (a redelivered turn that is running, or ran, is never run again).
        extra_env={
            "HARNESS_HEARTBEAT_TTL_S": "3",
            "HARNESS_REAP_INTERVAL_S": "3",
            "HARNESS_SHUTDOWN_GRACE_S": "1",
            "HARNESS_HOST_TIMEOUT_S": "120",
            "HARNESS_VISIBILITY_TIMEOUT_S": "15",
            "HARNESS_RESEND_AFTER_S": "20",
        },
    )
    state = Soak(cluster, store, random.Random(seed), kinds=kinds | {"none"})
    budget = [turns]
    started = time.monotonic()
    try:
        threads = [
            threading.Thread(target=state.run_worker, args=(budget,)) for _ in range(parallel)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(4)  # let the heartbeats of turns a killed worker held lapse
        cluster.reap()
        leaked_ids = [getattr(c, "name", "?") for c in cluster.containers()]
        leaked = len(leaked_ids)
        if leaked:
            state.problems.append(f"leaked containers: {leaked_ids}")
        client = cluster.client()
        live = sum(1 for _ in client.redis.scan_iter(f"{cluster.prefix}:run:*:credential"))
        client.close()
    finally:
        cluster.stop()
        store.stop()
    seconds = time.monotonic() - started
    lines = [
        f"turns {state.turns_done} in {seconds:.0f}s over {workers} worker processes "
        f"({parallel} runs at a time)",
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(state.faults.items())),
        f"leaked containers: {leaked}",
        f"live credentials after end: {live}",
        f"turns without exactly one terminal: {sum('terminals' in p for p in state.problems)}",
        f"turns with duplicate or missing events: {sum(map(_is_event_problem, state.problems))}",
        f"other problems: {len(state.problems)}"
        + "".join(f"\n  - {p}" for p in state.problems[:20]),
    ]
    ok = not state.problems and leaked == 0 and live == 0 and state.turns_done == turns
    return {
        "ok": ok,
        "lines": lines,
        "problems": state.problems,
        "leaked": leaked,
        "live": live,
        "turns": state.turns_done,
        "faults": dict(state.faults),
    }


if __name__ == "__main__":
    sys.exit(main())
