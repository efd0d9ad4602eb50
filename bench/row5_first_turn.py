"""Row 5: the first turn of a new run: container create + start + probe + first exec, from
submit to the terminal event seen, against ``docker run --rm -i`` of the same image and
harness (the CLI, network none), alternating. For reference, a bare exec in the container
just created: where a warm pool would bring the first turn. The pool (``HARNESS_WARM_POOL``)
is not implemented yet; its line says so."""

from __future__ import annotations

import time

from bench.consume import wait_terminal
from bench.context import NOOP, Bench
from bench.docker_raw import RawDocker, docker_run
from bench.stats import p50
from bench.table import Figure, RowResult
from bench.worker import DEMO_IMAGE


def run(bench: Bench) -> RowResult:
    repeats = bench.sizes.first_turn_repeats
    result = RowResult("5", f"first turn of a new run (docker, {repeats} runs)")
    if "docker" not in bench.backends:
        result.skipped = bench.docker_skip or "docker not selected"
        return result
    ours: list[float] = []
    dispatch: list[float] = []
    turn: list[float] = []
    base: list[float] = []
    bare_exec: list[float] = []
    raw = RawDocker()
    ok = 0
    try:
        _ = bench.worker
        docker_run(DEMO_IMAGE, ["harness-demo"], NOOP.encode())  # page the image in
        for _ in range(repeats):
            wall = time.time()
            started = time.perf_counter()
            run_id = bench.start_run("docker", NOOP)
            seen_at, events = wait_terminal(bench.redis, bench.stream(run_id), 1, timeout_s=120)
            ours.append(seen_at - started)
            first = next(e for e in events if e.type == "turn-started")
            dispatch.append(first.ts - wall)
            turn.append(events[-1].ts - first.ts)
            ok += events[-1].type == "turn-complete"
            container = bench.client.status(run_id)["container_id"]
            bare_exec.append(raw.timed_exec(container, ["harness-demo"], NOOP.encode()))
            bench.end_run(run_id)
            base.append(docker_run(DEMO_IMAGE, ["harness-demo"], NOOP.encode()))
    finally:
        raw.close()
    result.checks["every first turn ended with turn-complete"] = ok == repeats
    result.add(
        Figure(
            "docker: first turn, submit -> terminal p50 vs docker run",
            p50(ours) * 1000,
            p50(base) * 1000,
            "ms",
        ),
        Figure(
            "docker:   submit -> turn-started (create, start, probe) p50",
            p50(dispatch) * 1000,
            None,
            "ms",
        ),
        Figure("docker:   turn-started -> terminal (first exec) p50", p50(turn) * 1000, None, "ms"),
        Figure(
            "docker: first turn vs bare exec in a running container",
            p50(ours) * 1000,
            p50(bare_exec) * 1000,
            "ms",
        ),
        Figure(
            "docker: first turn with a warm pool (HARNESS_WARM_POOL)",
            None,
            p50(bare_exec) * 1000,
            "ms",
            target="close to exec latency",
            ours_text="not implemented yet",
        ),
    )
    result.notes.append(
        "warm pool: not implemented yet (sandbox/docker.py); the setting exists and is ignored"
    )
    return result
