"""Row 17: density. How many runs one host and one worker process hold, and what each costs,
with the Docker backend (a run's container kept between its turns) and a worker of the row's
own (threads pool, concurrency above the turns it is given at once; the default stream limit
and retention, as row 10):

1. N idle runs (1,000 in the full profile): each started with a no-op first turn (the demo
   harness, ``@complete ok``) by producer threads (each starts a run, waits for its terminal,
   starts the next), until every run is ``idle`` with its container running. Then, per idle
   run: the worker's resident set (VmRSS with the N runs - VmRSS with none, after a warm-up
   run that is ended, / N); Redis bytes (row 10's measure: ``MEMORY USAGE`` of every key of
   the runs and their share of the run indexes, against the same keys written as JSON, row
   10's <= 1.5x target); the container's memory, read from its cgroup files as ``docker
   stats`` computes it (usage minus the inactive file cache); the containerd shim that holds
   it (PSS); and the default dockerd and its containerd's PSS growth (the daemon is shared:
   other users' containers move it).
   A no-op turn (submit -> terminal seen) on the last run made (the 1,000th) against the
   first, alternating, medians; and the wall of making the N runs.
2. M of those runs (200 in the full profile) get a turn each that stays in flight while it
   keeps emitting (``@stream LINES DELAY``), submitted by a thread each, released together:
   the worker's resident set per in-flight turn (VmHWM during - VmRSS before, / M), its CPU
   per published event (CPU time from the release to the last terminal / the turns' stream
   entries: each turn's own start and end included, hence also per turn), and the most
   turns between their ``turn-started`` and their terminal at one moment (publisher times),
   with the worker's peak threads and open files beside its limit.

Only the Redis ratio has a target; the rest are figures. Checks: every run reached idle with
its container, every in-flight turn completed with exactly one terminal, every run ended and
no container of the row left. ``python -m bench --only 17``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from bench.at_once import submit_at_once
from bench.consume import wait_terminal
from bench.context import NOOP, Bench
from bench.density_host import (
    PeakSampler,
    container_memory,
    daemons_pss,
    open_files_limit,
    run_containers,
    scope_containers,
    shims_pss,
)
from bench.density_runs import (
    end_all,
    make_idle_runs,
    most_at_once,
    read_turns,
    redis_bytes,
    start_spread,
    timed_noop,
    wait_status,
    wait_turns,
)
from bench.row10_redis import TARGET_RATIO
from bench.stats import mib, p50
from bench.table import Figure, RowResult
from bench.worker import WorkerProcess
from config import Settings


@dataclass(frozen=True)
class Sizes:
    idle_runs: int
    producers: int
    """Threads making the runs (and ending them): dockerd makes a few containers a second."""
    timed_turns: int
    """No-op turns timed on the first and on the last run, each."""
    in_flight: int
    """Turns at once (on the first of the idle runs)."""
    lines: int
    delay_s: float
    """Each in-flight turn's ``@stream LINES DELAY``: it emits for LINES x DELAY seconds."""


SIZES = {
    "full": Sizes(1000, 24, 5, 200, 60, 0.5),
    "quick": Sizes(30, 16, 3, 30, 10, 0.5),
    "smoke": Sizes(5, 5, 2, 5, 4, 0.25),
}
HEADROOM = 16
"""Pool slots beyond the turns given at once (the run ends, a stray redelivery)."""


def run(bench: Bench) -> RowResult:
    sizes = SIZES.get(bench.profile, SIZES["full"])
    n, m = sizes.idle_runs, min(sizes.in_flight, sizes.idle_runs)
    result = RowResult("17", f"density ({n} idle runs, {m} turns in flight, one worker)")
    if "docker" not in bench.backends:
        result.skipped = f"needs Docker: {bench.docker_skip or 'not asked for'}"
        return result
    defaults = Settings.model_fields
    concurrency = max(m, sizes.producers) + HEADROOM
    worker = bench.use_worker(
        HARNESS_CONCURRENCY=str(concurrency),
        HARNESS_STREAM_MAXLEN=str(defaults["stream_maxlen"].default),
        HARNESS_RETENTION_S=str(defaults["retention_s"].default),
    )
    made: list[str] = []
    warm = ""
    try:
        warm = bench.start_run("docker", NOOP)
        wait_terminal(bench.redis, bench.stream(warm), 1, timeout_s=120, keep=False)
        empty = [timed_noop(bench, warm) for _ in range(sizes.timed_turns)]
        bench.client.end(warm, timeout=60)  # the worker warmed (threads, Docker client), no run
        time.sleep(0.5)
        _idle(bench, result, worker, sizes, made, empty)
        _in_flight(bench, result, worker, sizes, made[:m], concurrency)
    finally:
        everything = [r for r in (warm, *made) if r]
        ended = end_all(bench, everything, sizes.producers)
        left = run_containers(bench.env.scope, everything)
        bench.stop_worker()
    result.checks[f"all {len(everything)} runs ended"] = ended
    result.checks["no container of the row left"] = not left
    return result


def _idle(
    bench: Bench,
    result: RowResult,
    worker: WorkerProcess,
    sizes: Sizes,
    made: list[str],
    empty: list[float],
) -> None:
    n = sizes.idle_runs
    before, daemons_before = worker.rss_bytes(), daemons_pss()
    runs, create_s = make_idle_runs(bench, n, sizes.producers)
    made.extend(runs)
    idle = wait_status(bench, made, "idle", 60 + n / 10, "runs idle")
    containers = run_containers(bench.env.scope, made)
    running = {c["Id"] for c in scope_containers(bench.env.scope) if c.get("State") == "running"}
    result.checks[f"all {n} runs idle, each with its container running"] = idle and all(
        containers.get(r) in running for r in made
    )
    time.sleep(1.0)
    after, daemons_after = worker.rss_bytes(), daemons_pss()
    memories = [container_memory(c) for c in containers.values()]
    counted = [size for size in memories if size is not None]
    shims, shim_count = shims_pss(containers.values())
    stored = redis_bytes(bench, made)
    first, last = [], []
    for _ in range(sizes.timed_turns):  # alternating: a shared machine's drift hits both
        first.append(timed_noop(bench, made[0]))
        last.append(timed_noop(bench, made[-1]))
    held, as_json = stored.held / n, stored.as_json / n
    result.add(
        Figure(f"worker RSS per idle run ({n} runs)", (after - before) / n / 1024, None, "KiB"),
        Figure(f"  worker RSS with {n} idle runs vs with none", mib(after), mib(before), "MiB"),
        Figure(
            "Redis bytes per idle run vs its keys as JSON",
            held,
            as_json,
            "B",
            target=f"<= {TARGET_RATIO:g}x",
            met=held / as_json <= TARGET_RATIO,
        ),
        Figure(
            "container memory per idle run (cgroup: usage - inactive file)",
            sum(counted) / max(len(counted), 1) / 1024,
            None,
            "KiB",
        ),
        Figure("  containerd shim per idle run (PSS)", shims / max(shim_count, 1) / 1024, None,
               "KiB"),
    )  # fmt: skip
    if daemons_before is not None and daemons_after is not None:
        result.add(
            Figure("  dockerd + containerd growth per idle run (PSS)",
                   (daemons_after - daemons_before) / n / 1024, None, "KiB")
        )  # fmt: skip
    result.add(
        Figure(f"no-op turn on run {n} vs run 1, submit -> terminal p50", p50(last) * 1e3,
               p50(first) * 1e3, "ms"),
        Figure("  no-op turn with no other run (before them) p50", p50(empty) * 1e3, None, "ms"),
        Figure(f"wall to make {n} runs ({sizes.producers} producer threads)", create_s, None,
               "s"),
        Figure("  runs made per second", n / create_s, None, "runs/s"),
    )  # fmt: skip
    result.notes.append(
        f"idle: {mib(stored.held):.2f} MiB in Redis; "
        f"{len(counted)} container cgroups read ({sum(counted) / 2**20:.1f} MiB), "
        f"{shim_count} shims; turns on run 1 "
        + ", ".join(f"{t * 1e3:.0f}" for t in first)
        + f" ms, on run {n} "
        + ", ".join(f"{t * 1e3:.0f}" for t in last)
        + " ms"
    )
    result.notes.append(
        f"idle run's record: {stored.record}; its keys (runs holding it: MEMORY USAGE / "
        "as JSON, B each): "
        + "; ".join(
            f"{name} ({count}: {held // count} / {raw // count})"
            for name, (count, held, raw) in sorted(stored.by_key.items())
        )
    )


def _in_flight(
    bench: Bench,
    result: RowResult,
    worker: WorkerProcess,
    sizes: Sizes,
    runs: list[str],
    concurrency: int,
) -> None:
    m, script = len(runs), f"@stream {sizes.lines} {sizes.delay_s:g}"
    turns: dict[str, int] = {}

    def submit(run_id: str) -> None:
        turns[bench.stream(run_id)] = bench.client.submit_turn(run_id, script)

    time.sleep(0.5)
    before = worker.rss_bytes()
    worker.reset_peak()
    cpu = worker.cpu_seconds()
    with PeakSampler(worker.pid) as sampler:
        started, submitted = submit_at_once([partial(submit, r) for r in runs])
        seen = wait_turns(bench.redis, turns, timeout_s=120 + sizes.lines * sizes.delay_s * 4)
        cpu = worker.cpu_seconds() - cpu
        peak = worker.peak_rss_bytes()
    reads = read_turns(bench.redis, turns)
    events = sum(t.events for t in reads)
    at_once, spread = most_at_once(reads), start_spread(reads)
    hold_s = sizes.lines * sizes.delay_s
    one_each = len(reads) == m and all(t.completed and t.terminals == 1 for t in reads)
    result.checks[f"all {m} in-flight turns completed with exactly one terminal"] = one_each
    result.add(
        Figure(f"worker RSS per in-flight turn ({m} at once)", mib(peak - before) / m, None,
               "MiB"),
        Figure("  worker RSS before -> peak", mib(peak), mib(before), "MiB"),
        Figure("worker CPU per published event during the burst", cpu / events * 1e6, None,
               "us"),
        Figure("  worker CPU per in-flight turn", cpu / m * 1e3, None, "ms"),
        Figure("  events published by the turns", events, None, "ev"),
        Figure(f"  turns in flight at one moment, most, vs {m}", at_once, m, "turns"),
        Figure(f"  wall: release -> last terminal vs one turn's {hold_s:g} s",
               max(seen.values()) - started, hold_s, "s"),
        Figure(f"  of which submitting {m} turns", submitted, None, "s"),
        Figure("  the turns' starts, first -> last turn-started", spread, None, "s"),
    )  # fmt: skip
    limit = open_files_limit(worker.pid)
    result.notes.append(
        f"in flight ({script}): worker concurrency {concurrency}; at its peak "
        f"{sampler.threads} threads, {sampler.fds} open files (limit "
        f"{limit if limit is not None else 'none'})"
    )
    if at_once < m:
        result.notes.append(
            f"in flight: at most {at_once} of {m} turns ran at one moment: their starts (an "
            f"exec each, through dockerd) spread over {spread:.1f} s, the turn lasts "
            f"{hold_s:g} s; the worker's threads and files are above (a longer @stream holds "
            "them all)"
        )
