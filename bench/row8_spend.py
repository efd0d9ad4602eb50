"""Row 8: spend under control (issue 18). The cost of the budget check per event: a stream
of text and usage events published to a real Redis stream through the worker's own
``Publishing`` with a run budget (every event goes past the guard) against the same without
one (target: at least 0.97x the events per second). And the cost of taking and giving back a
concurrency slot of an API key per turn (the Lua call of ``worker.spend.slots`` on a real Redis)
against a bare Redis round trip (target: under 2 ms p50). Both alternate within each repeat,
so drift on a shared machine hits both alike: the streams run in adjacent pairs, each pair
in the other order from the last (without-with, with-without, ...), and the verdict is the
median of the pairs' ratios, so neither a drift across the row nor the second of a pair's
place decides it. Needs Redis, no worker and no Docker."""

from __future__ import annotations

import os
import time
import uuid
from typing import cast

import redis

from adapters.events import AssistantText, Event, Usage
from bench.context import Bench
from bench.stats import p50
from bench.table import Figure, RowResult
from bench.worker import REDIS_URL, delete_keys
from config import load_settings
from worker.deps import Shutdown, TurnDeps
from worker.options.spec import RunOptions, TurnPayload
from worker.spend import slots
from worker.spend.budgets import Guard
from worker.store.keys import Keys, SyncRedis
from worker.store.publisher import RedisStreamPublisher
from worker.store.records import RunRecord, RunStore
from worker.turn.attempt import Publishing

SIZES = {"full": (200_000, 14, 2000), "quick": (50_000, 8, 500), "smoke": (2_000, 2, 50)}
"""Profile -> (events per stream, pairs of streams, slot acquisitions)."""
BATCH = 200
"""Events per ``send``: the read loop publishes what arrived together in one batch."""
RATIO_TARGET = 0.97
SLOT_TARGET_MS = 2.0
GRANT = "BENCH_SLOT_KEY"


def _stream(count: int) -> list[Event]:
    """A harness's output: text, with a usage event every 20 (as a multi-step turn)."""
    out: list[Event] = []
    for i in range(count):
        if i % 20 == 19:
            out.append(Usage(input_tokens=120, output_tokens=30, cost_usd=0.0001))
        else:
            out.append(AssistantText(text=f"line {i} of the answer, streamed as it comes"))
    return out


def _publish(
    client: SyncRedis, keys: Keys, events: list[Event], budget: bool
) -> tuple[float, float]:
    """Events per second through Publishing into a fresh stream, with or without a budget,
    and this process's CPU seconds per event meanwhile."""
    run_id = "r" + uuid.uuid4().hex[:24]
    out = Publishing(RedisStreamPublisher(client, keys, run_id, 1, maxlen=len(events) + 10))
    if budget:
        record = RunRecord(run_id=run_id, status="running", budget={"max_tokens": 10**12})
        out.guard = Guard(record, load_settings())
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(events), BATCH):
        out.send(events[i : i + BATCH])
    out.publisher.drain(60)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    client.delete(keys.events(run_id))
    return len(events) / elapsed, cpu / len(events)


def run(bench: Bench) -> RowResult:
    count, repeats, takes = SIZES.get(bench.profile, SIZES["full"])
    result = RowResult("8", f"spend under control ({count:,} events, {takes} slot takes)")
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client = cast(SyncRedis, raw)
    keys = Keys("b8" + uuid.uuid4().hex[:8])
    try:
        events = _stream(count)
        rates: dict[bool, list[float]] = {True: [], False: []}
        cpus: dict[bool, list[float]] = {True: [], False: []}
        ratios: list[float] = []
        for pair in range(repeats):
            for budget in (False, True) if pair % 2 == 0 else (True, False):
                rate, cpu = _publish(client, keys, events, budget)
                rates[budget].append(rate)
                cpus[budget].append(cpu)
            ratios.append(rates[True][-1] / rates[False][-1])
        ratio = p50(ratios)
        result.add(
            Figure(
                f"events/s with a run budget / without, median of {repeats} adjacent pairs",
                ratio, 1.0, "x",
                target=f">= {RATIO_TARGET:g}x", met=ratio >= RATIO_TARGET,
            ),
            Figure("  events/s with a run budget vs without, p50", p50(rates[True]),
                   p50(rates[False]), "events/s"),
            Figure("  this process's CPU per event, with a run budget vs without, p50",
                   p50(cpus[True]) * 1e6, p50(cpus[False]) * 1e6, "us"),
        )  # fmt: skip

        taken, pings, correct = _slots(client, keys, takes)
        result.add(
            Figure(
                "take and give back a key slot per turn p50 vs a Redis PING",
                p50(taken) * 1000, p50(pings) * 1000, "ms",
                target=f"< {SLOT_TARGET_MS:g} ms", met=p50(taken) * 1000 < SLOT_TARGET_MS,
            )
        )  # fmt: skip
        result.checks["every turn got its slot and gave it back"] = correct
        result.notes.append(
            f"{repeats} pairs of streams of {count:,} events in batches of {BATCH} (a usage "
            "event in every 20, each checked against the budget), each pair in the other "
            f"order from the last; the pairs' ratios from {min(ratios):.3f}x to "
            f"{max(ratios):.3f}x; the slot take is one Lua call and its release another, on a "
            "key with 8 slots and none waiting"
        )
    finally:
        delete_keys(raw, keys.prefix)
        raw.close()
    return result


def _slots(client: SyncRedis, keys: Keys, takes: int) -> tuple[list[float], list[float], bool]:
    settings = load_settings(key_prefix=keys.prefix, key_slots=f"{GRANT}=8")
    deps = TurnDeps(
        settings=settings,
        redis=client,
        keys=keys,
        store=RunStore(client, keys, settings.retention_s),
        sandbox_for=lambda backend: None,  # type: ignore[arg-type,return-value]
        worker_id="bench:1",
        shutdown=Shutdown(0),
    )
    os.environ.setdefault(GRANT, "bench-slot-value")
    options = RunOptions(harness="stdio-json", grants=(GRANT,), producer="bench")
    taken: list[float] = []
    pings: list[float] = []
    correct = True
    for turn in range(1, takes + 1):
        payload = TurnPayload(run_id="r" + "b" * 24, turn=turn, input="x")
        started = time.perf_counter()
        hold = slots.take(deps, payload, options)
        if hold is None or not hold.held:
            correct = False
            continue
        hold.release()
        taken.append(time.perf_counter() - started)
        started = time.perf_counter()
        client.ping()
        pings.append(time.perf_counter() - started)
    return taken or [float("nan")], pings, correct
