"""Row 2: event throughput. The demo harness prints N small JSON lines as fast as it can
(``@flood N``); events per second from its stdout into the stream, against pipelined XADD
of the very same entries (read back from the stream: same ids, fields and trimming) from
one Python process. Every event must be present, in order.

Our rate is taken from the stream itself: each entry carries the time its batch was
published, so the window runs from the first batch to the terminal event's, which excludes
the harness's start and the consumer. Entries that share a timestamp were one batch. On a
shared machine the rates swing with the load, so the CPU time per event is printed too: the
worker process's (every thread, from the turn's submit to its end) against the baseline
client's."""

from __future__ import annotations

import math
import time
import uuid

import redis

from bench.consume import read_turn, wait_terminal_quietly
from bench.context import Bench
from bench.stats import p50
from bench.table import Figure, RowResult

TARGET_RATIO = 0.7
BASELINE_BATCH = 1000


def xadd_baseline(
    client: redis.Redis, key: str, entries: list[tuple[str, dict[str, str]]], maxlen: int
) -> tuple[float, float]:
    """(Seconds, CPU seconds of this process) to XADD ``entries`` (same ids, fields and
    trimming), pipelined in batches, sent the leanest way redis-py sends a command (as the
    publisher does)."""
    client.delete(key)
    cpu = time.process_time()
    started = time.perf_counter()
    for at in range(0, len(entries), BASELINE_BATCH):
        pipe = client.pipeline(transaction=False)
        command = pipe.execute_command
        for entry_id, fields in entries[at : at + BASELINE_BATCH]:
            command(
                "XADD", key, "MAXLEN", "~", maxlen, entry_id,
                "type", fields["type"], "data", fields["data"], "ts", fields["ts"],
            )  # fmt: skip
        pipe.execute()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    client.delete(key)
    return elapsed, cpu


def check_order(entries: list[tuple[str, dict[str, str]]], count: int) -> tuple[bool, str]:
    """Every flood line present once, in order, with consecutive entry ids."""
    import json

    texts = [
        json.loads(fields["data"]).get("text")
        for _, fields in entries
        if fields["type"] == "assistant-text"
    ]
    expected = [f"flood {i}" for i in range(count)]
    if texts != expected:
        missing = len(set(expected) - set(texts))
        return False, f"{len(texts)} flood events, {missing} missing or out of order"
    seqs = [int(entry_id.split("-")[1]) for entry_id, _ in entries]
    if seqs != list(range(len(seqs))):
        return False, "entry ids are not consecutive"
    if entries[-1][1]["type"] != "turn-complete":
        return False, f"last event is {entries[-1][1]['type']}"
    return True, ""


def run(bench: Bench) -> RowResult:
    n = bench.sizes.flood_events
    result = RowResult("2", f"event throughput ({n:,} lines)")
    maxlen = bench.env.settings().stream_maxlen
    for backend in bench.backends:
        rates, bases, per_batch, cpu_ours, cpu_base = [], [], [], [], []
        for _ in range(bench.sizes.flood_repeats):
            worker = bench.worker
            cpu = worker.cpu_seconds()
            run_id = bench.start_run(backend, f"@flood {n}")
            key = bench.stream(run_id)
            wait_terminal_quietly(bench.redis, key, 1)
            cpu = worker.cpu_seconds() - cpu
            entries = read_turn(bench.redis, key, 1)
            bench.end_run(run_id)
            bench.redis.delete(key)
            ok, why = check_order(entries, n)
            name = f"{backend}: all {n:,} events present, in order"
            result.checks[name] = result.checks.get(name, True) and ok
            if not ok:
                result.notes.append(f"{backend}: {why}")
            stamps = [float(fields["ts"]) for _, fields in entries]
            window = stamps[-1] - stamps[1]  # from the session line's batch to the terminal's
            events = len(entries) - 1  # everything after turn-started
            rates.append(events / window if window > 0 else math.nan)
            per_batch.append(events / len(set(stamps[1:])))
            scratch = f"{bench.env.prefix}:bench:xadd:{uuid.uuid4().hex[:8]}"
            seconds, base_cpu = xadd_baseline(bench.redis, scratch, entries, maxlen)
            bases.append(len(entries) / seconds)
            cpu_ours.append(cpu / len(entries) * 1e6)
            cpu_base.append(base_cpu / len(entries) * 1e6)
        ours, base = p50(rates), p50(bases)
        result.add(
            Figure(
                f"{backend}: events/s stdout -> stream vs pipelined XADD",
                ours,
                base,
                "ev/s",
                target=f">= {TARGET_RATIO:g}x baseline",
                met=ours / base >= TARGET_RATIO,
            ),
            Figure(
                f"{backend}:   events per XADD batch (mean)", p50(per_batch), BASELINE_BATCH, "ev"
            ),
            Figure(
                f"{backend}:   CPU per event: worker process vs XADD client",
                p50(cpu_ours),
                p50(cpu_base),
                "us",
            ),
        )
        if len(rates) > 1:
            result.notes.append(
                f"{backend}: medians of {len(rates)} alternating runs; ours "
                + ", ".join(f"{r:,.0f}" for r in rates)
                + "; baseline "
                + ", ".join(f"{b:,.0f}" for b in bases)
            )
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
