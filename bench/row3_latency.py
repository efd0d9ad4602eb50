"""Row 3: event latency. The demo harness stamps each line with its clock (``@stamp N``, 5 ms
apart); latency is the consumer's clock when ``XREAD BLOCK`` returns the event minus the
stamp. Baseline: the same harness run bare (subprocess, or exec in the run's container) by
a relay that XADDs each line the moment it is read, one command per line, read by the same
kind of consumer."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import redis

from bench.consume import before_turn
from bench.context import Bench
from bench.stats import p50, percentile
from bench.table import Figure, RowResult
from bench.worker import ROOT

TARGET_P99_MS = 20.0


class Follower(threading.Thread):
    """An ``XREAD BLOCK`` consumer: (stamped text, arrival time) of each entry, until the
    turn's terminal event (ours) or the relay's ``end`` entry (baseline)."""

    def __init__(self, client: redis.Redis, key: str, cursor: str) -> None:
        super().__init__(daemon=True)
        self.client, self.key, self.cursor = client, key, cursor
        self.seen: list[tuple[str, float]] = []
        self.done = threading.Event()
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            reply = self.client.xread({self.key: self.cursor}, count=1000, block=500)
            now = time.time()
            for entry_id, fields in reply[0][1] if reply else []:
                self.cursor = entry_id
                if "end" in fields or fields.get("type") in ("turn-complete", "session-error"):
                    self.done.set()
                    return
                raw = fields.get("data", "")
                try:
                    text = json.loads(raw).get("text", "")
                except ValueError:
                    continue
                if text:
                    self.seen.append((text, now))


def latencies(seen: list[tuple[str, float]]) -> tuple[list[float], list[int]]:
    out, order = [], []
    for text, at in seen:
        parts = text.split()
        if len(parts) == 2:
            try:
                stamp, index = float(parts[0]), int(parts[1])
            except ValueError:
                continue
            out.append(at - stamp)
            order.append(index)
    return out, order


def ours(bench: Bench, backend: str, script: str) -> tuple[list[float], list[int], str]:
    """Our latencies and stamp order, and the run (kept for the baseline's container)."""
    run_id = bench.start_run(backend, "@complete warm")
    key = bench.stream(run_id)
    from bench.consume import wait_terminal

    wait_terminal(bench.redis, key, 1)
    follower = Follower(bench.env.redis(), key, before_turn(2))
    follower.start()
    turn = bench.client.submit_turn(run_id, script)
    assert turn == 2
    if not follower.done.wait(120):
        follower.stop = True
        raise TimeoutError("the stamp turn did not end")
    values, order = latencies(follower.seen)
    return values, order, run_id


def baseline(bench: Bench, backend: str, run_id: str, script: str) -> list[float]:
    key = f"{bench.env.prefix}:bench:relay:{uuid.uuid4().hex[:8]}"
    follower = Follower(bench.env.redis(), key, "0-0")
    follower.start()
    argv = [sys.executable, "-m", "bench.relay", bench.env.vars["HARNESS_REDIS_URL"], key, script]
    if backend == "docker":
        container = bench.client.status(run_id)["container_id"]
        argv += ["--container", container, "harness-demo"]
    else:
        argv += ["--", bench.executable("local")]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=300)
    if not follower.done.wait(30):
        follower.stop = True
    bench.redis.delete(key)
    values, _ = latencies(follower.seen)
    return values


def run(bench: Bench) -> RowResult:
    n, gap = bench.sizes.stamp_lines, bench.sizes.stamp_interval_s
    result = RowResult("3", f"event latency ({n} stamped lines, {gap * 1000:g} ms apart)")
    script = f"@stamp {n} {gap}"
    for backend in bench.backends:
        mine, order, run_id = ours(bench, backend, script)
        try:
            base = baseline(bench, backend, run_id, script)
        finally:
            bench.end_run(run_id)
        result.checks[f"{backend}: all {n} stamped events present, in order"] = order == list(
            range(n)
        )
        relay = "bare exec" if backend == "docker" else "bare subprocess"
        p99 = percentile(mine, 99) * 1000
        result.add(
            Figure(
                f"{backend}: stdout -> XREAD p50 vs {relay} + XADD per line",
                p50(mine) * 1000,
                p50(base) * 1000,
                "ms",
            ),
            Figure(
                f"{backend}: stdout -> XREAD p99",
                p99,
                percentile(base, 99) * 1000,
                "ms",
                target=f"p99 <= {TARGET_P99_MS:g} ms",
                met=p99 <= TARGET_P99_MS,
            ),
            Figure(f"{backend}: stdout -> XREAD max", max(mine) * 1000, max(base) * 1000, "ms"),
        )
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
