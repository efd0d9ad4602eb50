"""Row 2: event throughput. The demo harness prints N small JSON lines as fast as it can
(``@flood N``); events per second from its stdout into the stream, against pipelined XADD
of the very same entries (read back from the stream: same ids, fields and trimming) from
one Python process. Every event must be present, in order.

Our rate is taken from the stream itself: each entry carries the time its batch was
published, so the window runs from the first batch to the terminal event's, which excludes
the harness's start and the consumer. Entries that share a timestamp were one batch."""

from __future__ import annotations

import time
import uuid

import redis

from bench.consume import read_turn, wait_terminal_quietly
from bench.context import Bench
from bench.table import Figure, RowResult

TARGET_RATIO = 0.6
BASELINE_BATCH = 1000


def xadd_baseline(
    client: redis.Redis, key: str, entries: list[tuple[str, dict[str, str]]], maxlen: int
) -> float:
    """Seconds to XADD ``entries`` with their ids, pipelined in batches, from this process."""
    client.delete(key)
    started = time.perf_counter()
    for at in range(0, len(entries), BASELINE_BATCH):
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in entries[at : at + BASELINE_BATCH]:
            pipe.xadd(key, fields, id=entry_id, maxlen=maxlen, approximate=True)
        pipe.execute()
    elapsed = time.perf_counter() - started
    client.delete(key)
    return elapsed


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
        run_id = bench.start_run(backend, f"@flood {n}")
        key = bench.stream(run_id)
        wait_terminal_quietly(bench.redis, key, 1)
        entries = read_turn(bench.redis, key, 1)
        bench.end_run(run_id)
        ok, why = check_order(entries, n)
        result.checks[f"{backend}: all {n:,} events present, in order"] = ok
        if not ok:
            result.notes.append(f"{backend}: {why}")
        stamps = [float(fields["ts"]) for _, fields in entries]
        first_batch = float(entries[1][1]["ts"])  # the session line's batch
        window = stamps[-1] - first_batch
        events = len(entries) - 1  # everything after turn-started
        ours = events / window if window > 0 else None
        batches = len(set(stamps[1:]))
        scratch = f"{bench.env.prefix}:bench:xadd:{uuid.uuid4().hex[:8]}"
        base_s = xadd_baseline(bench.redis, scratch, entries, maxlen)
        base = len(entries) / base_s
        ratio = ours / base if ours else 0.0
        result.add(
            Figure(
                f"{backend}: events/s stdout -> stream vs pipelined XADD",
                ours,
                base,
                "ev/s",
                target=f">= {TARGET_RATIO:g}x baseline",
                met=ratio >= TARGET_RATIO,
            ),
            Figure(
                f"{backend}:   events per XADD batch (mean)", events / batches, BASELINE_BATCH, "ev"
            ),
        )
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
