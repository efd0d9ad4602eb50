"""Row 11: the cost of tracing. The flood of row 2 (``@flood N``) through a worker that
traces (``OTEL_EXPORTER_OTLP_ENDPOINT`` set, its spans exported to an OTLP receiver of ours
on loopback) against the same flood through a worker that does not, alternating in one run;
and a no-op turn's submit -> terminal, likewise. Every event must be present, in order; the
traced turns must reach the receiver, the untraced ones must not."""

from __future__ import annotations

import math
import time

from bench.consume import read_turn, wait_terminal_quietly
from bench.context import NOOP, Bench
from bench.otlp_receiver import OtlpReceiver
from bench.row2_throughput import check_order
from bench.stats import p50
from bench.table import Figure, RowResult

TARGET_RATIO = 0.9
"""Tracing may cost at most a tenth of the event rate: its spans are per turn and per step,
never per event."""
NOOP_TURNS = 5


def _flood_rate(bench: Bench, backend: str, n: int, result: RowResult, mode: str) -> float:
    run_id = bench.start_run(backend, f"@flood {n}")
    key = bench.stream(run_id)
    wait_terminal_quietly(bench.redis, key, 1)
    entries = read_turn(bench.redis, key, 1)
    bench.end_run(run_id)
    bench.redis.delete(key)
    ok, why = check_order(entries, n)
    name = f"{backend}: all {n:,} events present, in order ({mode})"
    result.checks[name] = result.checks.get(name, True) and ok
    if not ok:
        result.notes.append(f"{backend} {mode}: {why}")
    stamps = [float(fields["ts"]) for _, fields in entries]
    window = stamps[-1] - stamps[1]
    return (len(entries) - 1) / window if window > 0 else math.nan


def _noop_turn_s(bench: Bench, backend: str) -> float:
    """The median submit -> terminal of no-op turns in one run (its container already up)."""
    run_id = bench.start_run(backend, NOOP)
    key = bench.stream(run_id)
    wait_terminal_quietly(bench.redis, key, 1)
    times = []
    for _ in range(NOOP_TURNS):
        started = time.perf_counter()
        turn = bench.client.submit_turn(run_id, NOOP)
        wait_terminal_quietly(bench.redis, key, turn)
        times.append(time.perf_counter() - started)
    bench.end_run(run_id)
    bench.redis.delete(key)
    return p50(times)


def run(bench: Bench) -> RowResult:
    n = bench.sizes.flood_events
    result = RowResult("11", f"tracing on against off ({n:,} lines)")
    receiver = OtlpReceiver()
    traced = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    try:
        for backend in bench.backends:
            rates: dict[str, list[float]] = {"on": [], "off": []}
            turns: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(bench.sizes.flood_repeats):
                for mode in ("off", "on"):
                    bench.use_worker(**(traced if mode == "on" else {}))
                    before = len(receiver.spans)
                    rates[mode].append(_flood_rate(bench, backend, n, result, mode))
                    turns[mode].append(_noop_turn_s(bench, backend))
                    bench.stop_worker()  # its shutdown flushes the batched spans
                    exported = {s.name for s in receiver.spans[before:]}
                    name = f"{backend}: the turns' spans exported only with tracing on"
                    ok = ("invoke_agent stdio-json" in exported) == (mode == "on")
                    result.checks[name] = result.checks.get(name, True) and ok
            on, off = p50(rates["on"]), p50(rates["off"])
            result.add(
                Figure(
                    f"{backend}: events/s with tracing on vs off",
                    on,
                    off,
                    "ev/s",
                    target=f">= {TARGET_RATIO:g}x off",
                    met=on / off >= TARGET_RATIO,
                ),
                Figure(
                    f"{backend}:   no-op turn submit -> terminal p50, tracing on vs off",
                    p50(turns["on"]) * 1000,
                    p50(turns["off"]) * 1000,
                    "ms",
                ),
            )
            if len(rates["on"]) > 1:
                result.notes.append(
                    f"{backend}: medians of {len(rates['on'])} alternating runs; on "
                    + ", ".join(f"{r:,.0f}" for r in rates["on"])
                    + "; off "
                    + ", ".join(f"{r:,.0f}" for r in rates["off"])
                )
        result.notes.append(f"{len(receiver.spans)} spans received in {receiver.requests} exports")
    finally:
        receiver.close()
        bench.stop_worker()
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
