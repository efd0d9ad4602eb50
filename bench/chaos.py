"""Chaos: runs on two Docker daemons while workers die, shut down, a host goes away and Redis
restarts, with no beat process and default host queues.

    python -m bench.chaos [--runs 12] [--turns 4] [--seed 3]

Two Docker daemons (the local one, ``a``, and ``scripts/second-dockerd``, ``b``), two worker
processes on each, one private Redis (append-only) as both broker and store. Each run is
driven by a producer thread, started a couple of seconds apart, until it has ``--turns``
completed turns; a turn that ends ``worker-lost``, ``shutdown`` or (once the host wait has
passed) ``sandbox`` is followed by the next one, as a real producer would. Meanwhile, on a
schedule: a busy worker SIGKILLed, another SIGTERMed, host ``b``'s workers all stopped for
longer than the host timeout and then started again, the Redis restarted (broker included),
then one more kill and shutdown. Nothing calls the reaper during the load: the workers'
own reaper passes must close what the faults leave.

Checked afterwards: every turn has exactly one terminal event, last, with contiguous ids
(``T-0 .. T-k``); every turn of a run ran in the run's one container (the record's
``container_id``, the ``harness.run_id`` label on the daemons and the container's hostname
as the harness saw it), on the daemon its host queue names; its session went on (a turn
after a completed turn resumed it: the workspace was kept); no run failed and no workspace
of a live run is gone; and after ``end`` of every run and a reaper pass: no container of
the deployment on either daemon, no workspace, no live credential.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.private_redis import PrivateRedis
from bench.scale_load import Cluster, Host, start_cluster
from bench.worker import signal_and_wait
from worker.client import HarnessClient, StreamEvent
from worker.errors import RunBusy, RunEnded, Unavailable

T = TypeVar("T")

LINES = 5
#: One turn: the container's hostname (its short id), then a few seconds of output, so that
#: a fault usually meets a turn in flight.
SCRIPT = f"@run hostname\n@stream {LINES} 0.4"
HOST_TIMEOUT_S = 6.0
HOST_WAIT_S = 90.0
HOST_AWAY_S = 14.0  # above the host timeout, well below the host wait
ENV = {
    "HARNESS_HEARTBEAT_TTL_S": "4",
    "HARNESS_REAP_INTERVAL_S": "3",
    "HARNESS_HOST_TIMEOUT_S": f"{HOST_TIMEOUT_S:g}",
    "HARNESS_HOST_WAIT_S": f"{HOST_WAIT_S:g}",
    "HARNESS_SHUTDOWN_GRACE_S": "1",
    # A killed worker's unacknowledged turn comes back soon (the redelivery guard makes a
    # copy of a turn that ran harmless), and a turn the broker lost is sent again.
    "HARNESS_VISIBILITY_TIMEOUT_S": "15",
    "HARNESS_RESEND_AFTER_S": "15",
}
#: Seconds after the load starts, what happens, and to which host.
SCHEDULE: list[tuple[float, str, str]] = [
    (3.0, "worker-kill", "a"),
    (7.0, "worker-term", "b"),
    (11.0, "host-away", "b"),
    (28.0, "redis-restart", ""),
    (32.0, "worker-kill", "b"),
    (36.0, "worker-term", "a"),
]
#: Endings a fault may give a turn; anything else (but turn-complete) is a problem.
FAULT_REASONS = {"worker-lost", "shutdown", "sandbox"}


@dataclass
class TurnLog:
    turn: int
    outcome: str = ""  # "turn-complete" or the session-error's reason
    waited_s: float = 0.0
    hostname: str = ""
    session_id: str = ""
    resumed: bool = False


@dataclass
class RunLog:
    run_id: str
    turns: list[TurnLog] = field(default_factory=list)
    containers: set[str] = field(default_factory=set)  # "host:container id", after each turn
    record_containers: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)

    @property
    def completed(self) -> int:
        return sum(t.outcome == "turn-complete" for t in self.turns)


@dataclass
class Chaos:
    cluster: Cluster
    store: PrivateRedis
    rng: random.Random
    turns_per_run: int
    runs: dict[str, RunLog] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[str] = field(default_factory=list)
    #: Turns a worker fault hit: run id, turn, when (unix time), kind.
    hit: list[tuple[str, int, float, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    #: Per run, its stream in short (text, activity and usage left out), for the report.
    streams: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float = field(default_factory=time.monotonic)

    # -- helpers ----------------------------------------------------------------------------

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def note(self, kind: str, text: str) -> None:
        with self.lock:
            self.faults[kind] += 1
            self.fault_log.append(f"{time.monotonic() - self.started:5.1f}s {kind}: {text}")

    @contextlib.contextmanager
    def redis_up(self) -> Iterator[None]:
        """Hold off a Redis restart for the length of one producer call."""
        with self.store.gate.shared():
            yield

    def retry(self, call: Callable[[], T], attempts: int = 40) -> T:
        """An idempotent producer call, again while Redis or the broker is away."""
        for _ in range(attempts - 1):
            try:
                with self.redis_up():
                    return call()
            except Unavailable:
                time.sleep(0.5)
        with self.redis_up():
            return call()

    def host(self, name: str) -> Host:
        return next(h for h in self.cluster.hosts if h.name == name)

    def slots(self, host: str) -> list[int]:
        """Indexes in cluster.processes of ``host``'s workers (spawned host by host)."""
        per_host = len(self.cluster.processes) // len(self.cluster.hosts)
        first = [h.name for h in self.cluster.hosts].index(host) * per_host
        return list(range(first, first + per_host))

    def queue_host(self) -> dict[str, Host]:
        return {self.cluster.host_queue(h): h for h in self.cluster.hosts}

    # -- producers --------------------------------------------------------------------------

    def drive(self, delay: float) -> None:
        time.sleep(delay)
        client = self.cluster.client()
        try:
            self._drive(client)
        except Exception as exc:  # noqa: BLE001 -- a producer's crash is a finding
            self.problem(f"producer crashed: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    def _drive(self, client: HarnessClient) -> None:
        with self.redis_up():
            run_id = client.start_run("stdio-json", SCRIPT, executable="harness-demo")
        run = RunLog(run_id)
        with self.lock:
            self.runs[run_id] = run
        queues = self.queue_host()
        turn = 1
        submitted = time.monotonic()
        while True:
            log = TurnLog(turn)
            run.turns.append(log)
            terminal = self._wait(client, run_id, turn)
            log.waited_s = time.monotonic() - submitted
            if terminal is None:
                return
            log.outcome = (
                terminal.type
                if terminal.type == "turn-complete"
                else str(terminal.data.get("reason"))
            )
            if log.outcome == "turn-complete":
                self._after_completed(client, run, log, queues)
            elif log.outcome not in FAULT_REASONS:
                self.problem(f"{run_id}/{turn}: ended {log.outcome}: {terminal.data}")
            elif log.outcome == "sandbox" and log.waited_s < HOST_WAIT_S:
                self.problem(
                    f"{run_id}/{turn}: ended sandbox after {log.waited_s:.0f}s, before the "
                    f"host wait ({HOST_WAIT_S:g}s) passed: {terminal.data.get('error')}"
                )
            if run.completed >= self.turns_per_run:
                return
            if len(run.turns) >= self.turns_per_run * 3:
                self.problem(f"{run_id}: {run.completed} turns completed of {len(run.turns)}")
                return
            submitted = time.monotonic()
            next_turn = self._submit(client, run_id, turn + 1)
            if next_turn is None:
                return
            turn = next_turn

    def _submit(self, client: HarnessClient, run_id: str, turn: int) -> int | None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with self.redis_up():
                    return client.submit_turn(run_id, SCRIPT)
            except RunBusy:
                time.sleep(0.2)  # the record catches up with the terminal event
            except RunEnded as exc:
                self.problem(f"{run_id}/{turn}: the run takes no more turns: {exc}")
                return None
            except Unavailable as exc:
                # Did it go through before the connection broke?
                record = self.retry(lambda: client.status(run_id))
                if int(record.get("turns") or 0) >= turn:
                    return turn
                self.problem(f"{run_id}/{turn}: submit failed, retrying: {exc}")
                time.sleep(0.5)
        self.problem(f"{run_id}/{turn}: still busy 60 s after the previous turn ended")
        return None

    def _wait(self, client: HarnessClient, run_id: str, turn: int) -> StreamEvent | None:
        deadline = time.monotonic() + HOST_WAIT_S + 90
        while time.monotonic() < deadline:
            try:
                return client.wait(run_id, turn, timeout=5)
            except TimeoutError:
                continue
            except Unavailable:
                time.sleep(0.5)
        record = self.retry(lambda: client.status(run_id))
        self.problem(
            f"{run_id}/{turn}: no terminal within {HOST_WAIT_S + 90:g}s "
            f"(record: status {record.get('status')}, queue {record.get('queue')})"
        )
        return None

    def _after_completed(
        self, client: HarnessClient, run: RunLog, log: TurnLog, queues: dict[str, Host]
    ) -> None:
        run_id = run.run_id
        events = self.retry(lambda: turn_events(client, run_id, log.turn))
        texts = [str(e.data.get("text")) for e in events if e.type == "assistant-text"]
        log.hostname = texts[0] if texts else ""
        if texts[1:] != [f"line {i}" for i in range(LINES)]:
            self.problem(f"{run_id}/{log.turn}: missing or duplicate text: {texts}")
        sessions = [e for e in events if e.type == "session"]
        if len(sessions) != 1:
            self.problem(f"{run_id}/{log.turn}: {len(sessions)} session events (ran twice?)")
        if sessions:
            log.session_id = str(sessions[0].data.get("session_id"))
            log.resumed = bool(sessions[0].data.get("resumed"))
        record = self.retry(lambda: client.status(run_id))
        if record.get("container_id"):
            run.record_containers.add(str(record["container_id"]))
        queue = str(record.get("queue") or "")
        run.queues.add(queue)
        placed = self.cluster.placements(run_id)
        run.containers.update(f"{host}:{cid}" for host, cid in placed)
        host = queues.get(queue)
        if host is None:
            self.problem(f"{run_id}/{log.turn}: its queue {queue!r} names no daemon")
        elif [h for h, cid in placed if log.hostname and cid.startswith(log.hostname)] != [
            host.name
        ]:
            self.problem(
                f"{run_id}/{log.turn}: routed to {host.name}, ran in {log.hostname!r}, "
                f"containers {placed}"
            )
        elif not workspace(self.cluster, host, run_id).is_dir():
            self.problem(f"{run_id}/{log.turn}: its workspace is gone")

    # -- faults -----------------------------------------------------------------------------

    def inject(self, stop: threading.Event) -> None:
        for at, kind, host in SCHEDULE:
            if stop.wait(max(0.0, self.started + at - time.monotonic())):
                return
            try:
                if kind == "worker-kill":
                    self.restart_worker(host, signal.SIGKILL, kind)
                elif kind == "worker-term":
                    self.restart_worker(host, signal.SIGTERM, kind)
                elif kind == "host-away":
                    self.host_away(host)
                elif kind == "redis-restart":
                    self.store.restart(down_for_s=2.0)
                    self.note(kind, "broker and store down for 2 s")
            except Exception as exc:  # noqa: BLE001 -- a failed injection is a finding
                self.problem(f"fault {kind} on {host or 'redis'} failed: {exc}")

    def busy_slot(self, host: str) -> tuple[int, tuple[str, int] | None]:
        """A worker of ``host`` that owns a turn in flight (else, after a few seconds, any),
        and the turn it holds."""
        slots = self.slots(host)
        by_pid = {self.cluster.processes[i].pid: i for i in slots}
        client = self.cluster.client()
        deadline = time.monotonic() + 4
        try:
            while time.monotonic() < deadline:
                with self.redis_up():
                    for run_id in list(self.runs):
                        record = client.redis.hgetall(client.keys.run(run_id))
                        turn = int(record.get("current_turn") or 0)
                        owner = client.redis.get(client.keys.turn_owner(run_id, turn))
                        pid = owner_pid(owner)
                        if pid in by_pid:
                            return by_pid[pid], (run_id, turn)
                time.sleep(0.2)
        finally:
            client.close()
        return self.rng.choice(slots), None

    def stop_worker(self, index: int, sig: signal.Signals) -> None:
        signal_and_wait(self.cluster.processes[index], sig)

    def respawn(self, indexes: list[int], host: str) -> None:
        per_host = len(self.slots(host))
        for index in indexes:
            self.cluster.processes[index] = self.cluster.spawn(self.host(host), index % per_host)
        self.cluster.wait_ready([self.cluster.processes[i] for i in indexes])

    def restart_worker(self, host: str, sig: signal.Signals, kind: str) -> None:
        index, holding = self.busy_slot(host)
        pid = self.cluster.processes[index].pid
        at = time.time()
        self.stop_worker(index, sig)
        if holding:
            with self.lock:
                self.hit.append((*holding, at, kind))
        what = f"{holding[0]}/{holding[1]}" if holding else "no turn in flight there"
        self.note(kind, f"worker {pid} on {host} ({what}), restarted")
        self.respawn([index], host)

    def host_away(self, host: str) -> None:
        slots = self.slots(host)
        pids = [self.cluster.processes[i].pid for i in slots]
        for n, index in enumerate(slots):  # one killed, the other(s) shut down warm
            self.stop_worker(index, signal.SIGKILL if n == 0 else signal.SIGTERM)
        time.sleep(HOST_AWAY_S)
        self.note("host-away", f"workers {pids} of {host} stopped for {HOST_AWAY_S:g} s")
        self.respawn(slots, host)

    # -- the checks after -------------------------------------------------------------------

    def verify_streams(self, client: HarnessClient) -> None:
        """Exactly one terminal per turn, last, and contiguous ids, for every turn submitted."""
        for run in self.runs.values():
            events = self.retry(lambda r=run: list(client.events(r.run_id)))
            by_turn: dict[int, list[StreamEvent]] = {}
            for event in events:
                by_turn.setdefault(event.turn, []).append(event)
            self.streams[run.run_id] = " ".join(
                f"{e.id}:{e.type}"
                + (f"({e.data.get('reason')})" if e.type == "session-error" else "")
                for e in events
                if e.type not in ("assistant-text", "sandbox-activity", "usage")
            )
            if sorted(by_turn) != [t.turn for t in run.turns]:
                self.problem(f"{run.run_id}: turns in the stream {sorted(by_turn)}")
            for turn, evs in sorted(by_turn.items()):
                where = f"{run.run_id}/{turn}"
                if [e.seq for e in evs] != list(range(len(evs))):
                    self.problem(f"{where}: ids not contiguous: {[e.id for e in evs]}")
                if evs[0].type != "turn-started":
                    self.problem(f"{where}: starts with {evs[0].type}")
                terminals = sum(e.terminal for e in evs)
                if terminals != 1 or not evs[-1].terminal:
                    self.problem(f"{where}: {terminals} terminals: {[e.type for e in evs]}")
            self.verify_hit_turns(run.run_id, by_turn)

    def verify_hit_turns(self, run_id: str, by_turn: dict[int, list[StreamEvent]]) -> None:
        """A killed worker's turn is closed ``worker-lost`` within the heartbeat TTL and a
        reap interval (plus a little slack: the worker's own reaper, nobody else); a warm
        shutdown ends its turn ``shutdown`` within the grace."""
        bounds = {
            "worker-kill": (
                "worker-lost",
                float(ENV["HARNESS_HEARTBEAT_TTL_S"]) + float(ENV["HARNESS_REAP_INTERVAL_S"]) + 3,
            ),
            # A turn with less than the grace left completes instead.
            "worker-term": ("shutdown", float(ENV["HARNESS_SHUTDOWN_GRACE_S"]) + 5),
        }
        for hit_run, turn, at, kind in self.hit:
            if hit_run != run_id or not by_turn.get(turn):
                continue
            last = by_turn[turn][-1]
            if last.ts < at:
                continue  # it had ended just before the signal
            reason, bound = bounds[kind]
            took = last.ts - at
            self.figures.append(f"{kind} → {last.data.get('reason', last.type)} in {took:.1f}s")
            ending = last.data.get("reason") or last.type
            if ending not in (reason, "turn-complete") or took > bound:
                self.problem(
                    f"{run_id}/{turn}: {kind} ended it {last.type} "
                    f"{last.data.get('reason')} {took:.1f}s later (expected {reason} "
                    f"within {bound:g}s)"
                )

    def verify_runs(self, client: HarnessClient) -> None:
        """One container per run, on the daemon its queue names; the session went on; the
        run is usable and its workspace is there."""
        queues = self.queue_host()
        if len(queues) != len(self.cluster.hosts):
            self.problem(f"the daemons share a host queue: {sorted(queues)}")
        for run in self.runs.values():
            rid = run.run_id
            record = self.retry(lambda r=rid: client.status(r))
            if record.get("status") != "idle":
                self.problem(f"{rid}: status {record.get('status')} ({record.get('last_error')})")
            placed = self.cluster.placements(rid)
            run.containers.update(f"{host}:{cid}" for host, cid in placed)
            hostnames = {t.hostname for t in run.turns if t.outcome == "turn-complete"}
            recorded = sorted(run.record_containers)
            if (
                len(hostnames) != 1
                or len(recorded) != 1
                or not recorded[0].startswith(next(iter(hostnames)))
            ):
                self.problem(
                    f"{rid}: its turns ran in containers {sorted(hostnames)} (by hostname), "
                    f"the record named {recorded}"
                )
            if len(run.containers) != 1:
                self.problem(
                    f"{rid}: more than one container of the run existed on the daemons at "
                    f"once: {sorted(run.containers)} (the record named {recorded})"
                )
            if len(run.queues) != 1:
                self.problem(f"{rid}: host queues {sorted(run.queues)}")
            host = queues.get(str(record.get("queue")))
            if host is None or not workspace(self.cluster, host, rid).is_dir():
                self.problem(f"{rid}: workspace gone (queue {record.get('queue')})")
            previous: TurnLog | None = None
            for log in run.turns:
                if log.outcome != "turn-complete":
                    continue
                if previous is not None and (
                    not log.resumed or log.session_id != previous.session_id
                ):
                    self.problem(
                        f"{rid}/{log.turn}: session {log.session_id} resumed={log.resumed}, "
                        f"after {previous.session_id} of turn {previous.turn}"
                    )
                previous = log

    def verify_nothing_left(self, client: HarnessClient) -> dict[str, int]:
        for run_id in self.runs:
            try:
                with self.redis_up():
                    client.end(run_id, timeout=60)
            except Exception as exc:  # noqa: BLE001 -- report it
                self.problem(f"{run_id}: end failed: {type(exc).__name__}: {exc}")
        self.cluster.reap()
        containers = [getattr(c, "name", "?") for c in self.cluster.containers()]
        workspaces = [
            str(path)
            for host in self.cluster.hosts
            for path in sorted((self.cluster.workspace_root(host) / "docker" / "run").glob("*"))
        ]
        credentials = [
            run_id for run_id in self.runs if client.redis.exists(client.keys.credential(run_id))
        ]
        for what, left in (
            ("containers", containers),
            ("workspaces", workspaces),
            ("credentials", credentials),
        ):
            if left:
                self.problem(f"{what} left after end and a reaper pass: {left}")
        return {
            "containers": len(containers),
            "workspaces": len(workspaces),
            "credentials": len(credentials),
        }


def distinct_daemons(cluster: Cluster) -> str:
    """Why the hosts' workers would share one host queue ("" when they do not): two daemons
    that a worker names alike (sandbox/identity.py), so runs would not keep their container."""
    by_queue: dict[str, list[str]] = {}
    for host in cluster.hosts:
        by_queue.setdefault(cluster.host_queue(host), []).append(host.docker_url or "default")
    for queue, daemons in by_queue.items():
        if len(daemons) > 1:
            return (
                f"the Docker daemons {daemons} are named alike, so their workers share the host "
                f"queue {queue}: runs would not keep their container"
            )
    return ""


def owner_pid(owner: str | None) -> int | None:
    """The pid in a turn owner's heartbeat value (``host:pid`` or ``host:pid/token``)."""
    match = re.search(r":(\d+)(?:/|$)", owner or "")
    return int(match.group(1)) if match else None


def workspace(cluster: Cluster, host: Host, run_id: str) -> Path:
    """A run's workspace on ``host`` (sandbox/docker/sandbox.py: ``<root>/docker/run/<run_id>``)."""
    return cluster.workspace_root(host) / "docker" / "run" / run_id


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    after = None if turn <= 1 else f"{turn - 1}-18446744073709551615"
    return [e for e in client.events(run_id, after=after) if e.turn == turn]


@dataclass
class ChaosReport:
    ok: bool
    lines: list[str]
    problems: list[str]
    outcomes: dict[str, int]
    faults: dict[str, int]
    left: dict[str, int]
    runs: int
    turns: int
    completed: int
    seconds: float


def chaos(
    runs: int = 12,
    turns: int = 4,
    seed: int = 3,
    workers_per_host: int = 2,
    concurrency: int = 6,
    stagger_s: float = 2.5,
) -> ChaosReport:
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="harness-chaos-"))
    (workdir / "redis").mkdir()
    store = PrivateRedis(workdir / "redis")
    store.start()
    try:
        cluster = start_cluster(
            redis_url=store.url,
            broker_url=store.url,
            workers_per_host=workers_per_host,
            concurrency=concurrency,
            workdir=workdir,
            extra_env=ENV,
        )
    except BaseException:
        store.stop()
        raise
    shared = distinct_daemons(cluster)
    if shared:
        cluster.stop()
        store.stop()
        raise RuntimeError(shared)
    state = Chaos(cluster, store, random.Random(seed), turns)
    stop = threading.Event()
    left: dict[str, int] = {}
    try:
        state.started = time.monotonic()
        faults = threading.Thread(target=state.inject, args=(stop,), name="chaos-faults")
        producers = [
            threading.Thread(target=state.drive, args=(i * stagger_s,), name=f"chaos-run-{i}")
            for i in range(runs)
        ]
        faults.start()
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        faults.join()  # every fault happens, even when the load is done first
        load_s = time.monotonic() - state.started
        client = cluster.client()
        try:
            state.verify_streams(client)
            state.verify_runs(client)
            left = state.verify_nothing_left(client)
        finally:
            client.close()
    finally:
        stop.set()
        cluster.stop()
        store.stop()
    seconds = time.monotonic() - state.started
    logs = [t for r in state.runs.values() for t in r.turns]
    outcomes = Counter(t.outcome or "no terminal" for t in logs)
    completed = outcomes.get("turn-complete", 0)
    waits = sorted(t.waited_s for t in logs) or [0.0]
    median, longest = waits[len(waits) // 2], waits[-1]
    waited = sum(w > HOST_TIMEOUT_S for w in waits)
    lines = [
        f"chaos: {runs} runs x {turns} completed turns on {len(cluster.hosts)} Docker daemons, "
        f"{len(cluster.processes)} workers, no beat, default host queues",
        f"turns {len(logs)} (completed {completed}) · load {load_s:.0f}s · wall {seconds:.0f}s",
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(state.faults.items())),
        *(f"  {line}" for line in state.fault_log),
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        f"submit → terminal: p50 {median:.1f}s · longest {longest:.1f}s · "
        f"{waited} turns over {HOST_TIMEOUT_S:g}s (waiting for a worker or their host)",
        "turns hit by a worker fault: " + ("; ".join(state.figures) or "none"),
        "left after end + reaper pass: " + ", ".join(f"{k} {v}" for k, v in left.items()),
        f"problems: {len(state.problems)}" + "".join(f"\n  - {p}" for p in state.problems[:40]),
    ]
    for run_id in sorted({r for r in state.runs if any(r in p for p in state.problems)}):
        lines.append(f"stream of {run_id}: {state.streams.get(run_id, '?')}")
    ok = not state.problems and len(state.runs) == runs and completed == runs * turns
    if ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        lines.append(f"worker logs kept in {workdir}")
    return ChaosReport(
        ok=ok,
        lines=lines,
        problems=state.problems,
        outcomes=dict(outcomes),
        faults=dict(state.faults),
        left=left,
        runs=len(state.runs),
        turns=len(logs),
        completed=completed,
        seconds=seconds,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    report = chaos(args.runs, args.turns, args.seed)
    for line in report.lines:
        print(line)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
