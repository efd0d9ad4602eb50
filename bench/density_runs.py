"""Many runs of one worker, made, read and ended concurrently (row 17): producer threads,
a quiet wait for many turns' terminals, each turn's events, and their Redis bytes."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import redis

from adapters.events import TERMINAL_TYPES
from bench.consume import read_turn, wait_terminal
from bench.context import NOOP, Bench
from bench.row10_redis import index_share, key_json_bytes, key_memory

PROGRESS_EVERY_S = 5.0


def _progress(label: str, done: int, total: int, started: float) -> None:
    took = time.monotonic() - started
    print(
        f"  row 17: {label} {done}/{total} ({done / max(took, 1e-9):.1f}/s, {took:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def make_idle_runs(bench: Bench, n: int, producers: int) -> tuple[list[str], float]:
    """``n`` Docker runs, each with a no-op first turn, started by ``producers`` threads (each
    starts a run, waits for its terminal, starts the next). Returns the run ids in the order
    their first turn ended, and the wall from the first start to the last terminal seen."""
    made: list[str] = []
    lock = threading.Lock()
    started = time.monotonic()
    last_print = [started]

    def one(_: int) -> None:
        run_id = bench.start_run("docker", NOOP)
        wait_terminal(bench.redis, bench.stream(run_id), 1, timeout_s=600, keep=False)
        with lock:
            made.append(run_id)
            now = time.monotonic()
            if now - last_print[0] >= PROGRESS_EVERY_S or len(made) == n:
                last_print[0] = now
                _progress("runs made", len(made), n, started)

    with ThreadPoolExecutor(producers, thread_name_prefix="producer") as pool:
        list(pool.map(one, range(n)))
    return made, time.monotonic() - started


def wait_status(
    bench: Bench, run_ids: list[str], wanted: str, timeout_s: float, label: str
) -> bool:
    """Poll the records until every run has status ``wanted``; False on the timeout."""
    started = time.monotonic()
    deadline, last_print, pending = started + timeout_s, started, list(run_ids)
    while pending and time.monotonic() < deadline:
        pipe = bench.redis.pipeline(transaction=False)
        for run_id in pending:
            pipe.hget(bench.env.keys.run(run_id), "status")
        statuses = pipe.execute()
        pending = [r for r, s in zip(pending, statuses, strict=True) if s != wanted]
        if time.monotonic() - last_print >= PROGRESS_EVERY_S:
            last_print = time.monotonic()
            _progress(label, len(run_ids) - len(pending), len(run_ids), started)
        if pending:
            time.sleep(0.2)
    return not pending


def end_all(bench: Bench, run_ids: list[str], producers: int) -> bool:
    """Ask for every run's end (not waiting: a worker tears each down), then wait until all
    are ended. True when they all are."""
    with ThreadPoolExecutor(producers, thread_name_prefix="ender") as pool:
        list(pool.map(lambda run_id: bench.client.end(run_id, wait=False), run_ids))
    return wait_status(bench, run_ids, "ended", 120 + len(run_ids), "runs ended")


def timed_noop(bench: Bench, run_id: str) -> float:
    """A no-op turn on an idle run: submit -> its terminal seen by XREAD BLOCK, seconds."""
    began = time.perf_counter()
    turn = bench.client.submit_turn(run_id, NOOP)
    seen, _ = wait_terminal(bench.redis, bench.stream(run_id), turn, keep=False)
    return seen - began


def wait_turns(r: redis.Redis, turns: dict[str, int], timeout_s: float) -> dict[str, float]:
    """Wait for each stream's turn to publish its terminal without reading the streams (the
    reader would compete for the CPU being measured): its last entry, polled, pipelined.
    Returns key -> perf_counter when seen."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(turns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(turns) - len(seen)} of {len(turns)} turns did not end")
        pending = [key for key in turns if key not in seen]
        pipe = r.pipeline(transaction=False)
        for key in pending:
            pipe.xrevrange(key, count=1)
        now = time.perf_counter()
        for key, last in zip(pending, pipe.execute(), strict=True):
            if (
                last
                and last[0][1].get("type") in TERMINAL_TYPES
                and int(last[0][0].split("-")[0]) == turns[key]
            ):
                seen[key] = now
        time.sleep(0.1)
    return seen


@dataclass(frozen=True)
class TurnRead:
    """One turn's entries as they stand in its stream."""

    events: int
    terminals: int
    completed: bool
    started_ts: float | None
    """The publisher's time of its ``turn-started`` batch."""
    ended_ts: float | None
    """The publisher's time of its (first) terminal's batch."""


def read_turns(r: redis.Redis, turns: dict[str, int]) -> list[TurnRead]:
    out = []
    for key, turn in turns.items():
        entries = read_turn(r, key, turn)
        kinds = [fields["type"] for _, fields in entries]
        stamps: dict[str, float] = {}
        for _, fields in entries:
            stamps.setdefault(fields["type"], float(fields["ts"]))
        terminals = [k for k in kinds if k in TERMINAL_TYPES]
        out.append(
            TurnRead(
                events=len(entries),
                terminals=len(terminals),
                completed=terminals == ["turn-complete"],
                started_ts=stamps.get("turn-started"),
                ended_ts=stamps.get(terminals[0]) if terminals else None,
            )
        )
    return out


def most_at_once(turns: list[TurnRead]) -> int:
    """The most turns between their ``turn-started`` and their terminal at one moment."""
    edges = sorted(
        (at, step)
        for t in turns
        if t.started_ts is not None and t.ended_ts is not None
        for at, step in ((t.started_ts, 1), (t.ended_ts, -1))
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def start_spread(turns: list[TurnRead]) -> float:
    """Seconds from the first turn's ``turn-started`` to the last one's."""
    starts = [t.started_ts for t in turns if t.started_ts is not None]
    return max(starts) - min(starts) if starts else 0.0


@dataclass(frozen=True)
class RedisBytes:
    held: int
    """``MEMORY USAGE`` of the runs' keys and their share of the indexes."""
    as_json: int
    """The same keys written as JSON (row 10's :func:`key_json_bytes`)."""
    by_key: dict[str, tuple[int, int, int]]
    """Each kind of key (``run:<id>:events``): runs holding it, MEMORY USAGE, as JSON."""
    record: str
    """The first run's record: its encoding, and its fields over Redis's default
    ``hash-max-listpack-value`` (64 B), which make a hash a hash table."""


def redis_bytes(bench: Bench, run_ids: list[str]) -> RedisBytes:
    """Row 10's measure of idle runs: every key under ``run:<id>`` of these runs, plus their
    share of the run indexes, in Redis and as JSON. One SCAN of the deployment's run keys."""
    r, keys, wanted = bench.redis, bench.env.keys, set(run_ids)
    head = keys.run("")
    by_key: dict[str, tuple[int, int, int]] = {}
    for key in r.scan_iter(match=keys.run("*"), count=1000):
        run_id, _, rest = key.removeprefix(head).partition(":")
        if run_id in wanted:
            name = "run:<id>" + (f":{rest}" if rest else "")
            count, held, raw = by_key.get(name, (0, 0, 0))
            by_key[name] = (count + 1, held + key_memory(r, [key]), raw + key_json_bytes(r, key))
    shared, shared_json = index_share(r, keys, run_ids)
    by_key["index shares"] = (len(run_ids), shared, shared_json)
    fields = cast("dict[str, str]", r.hgetall(keys.run(run_ids[0])))
    long = [
        f"{name} ({len(value.encode())} B)"
        for name, value in fields.items()
        if len(value.encode()) > 64
    ]
    encoding = r.object("encoding", keys.run(run_ids[0]))
    record = f"{encoding}, fields over 64 B: {', '.join(long) or 'none'}"
    return RedisBytes(
        sum(v[1] for v in by_key.values()), sum(v[2] for v in by_key.values()), by_key, record
    )
