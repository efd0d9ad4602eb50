"""Row 1: per-turn overhead. Submit -> terminal event seen by an ``XREAD BLOCK`` consumer, for a
no-op demo turn of a run whose sandbox already exists, against a bare exec of the same
harness in the same running container (Docker, through the SDK as the sandbox does it) or a
bare subprocess (local). Ours and the baseline alternate, so drift on a shared machine hits
both alike. Where our time goes is read from the stream: each entry carries the time its
batch was published."""

from __future__ import annotations

import time

from bench.consume import before_turn, wait_terminal
from bench.context import NOOP, Bench, bare_subprocess
from bench.stats import p50, percentile
from bench.table import Figure, RowResult

TARGET_MS = 15.0


def measure(bench: Bench, backend: str) -> dict[str, list[float]]:
    """Seconds per turn: ours, baseline, and the phases of ours."""
    sizes = bench.sizes
    client, r = bench.client, bench.redis
    run_id = bench.start_run(backend, NOOP)
    key = bench.stream(run_id)
    wait_terminal(r, key, 1, timeout_s=120)
    raw = None
    container = None
    if backend == "docker":
        from bench.docker_raw import RawDocker

        raw = RawDocker()
        container = client.status(run_id)["container_id"]
    home = bench.tmp / "bare-home"
    out: dict[str, list[float]] = {
        k: [] for k in ("ours", "base", "submit", "dispatch", "turn", "deliver")
    }
    try:
        for i in range(sizes.overhead_warmup + sizes.overhead_turns):
            wall = time.time()
            started = time.perf_counter()
            turn = client.submit_turn(run_id, NOOP)
            submitted = time.perf_counter()
            seen_at, events = wait_terminal(r, key, turn, cursor=before_turn(turn))
            terminal = events[-1]
            if terminal.type != "turn-complete":
                raise RuntimeError(f"no-op turn failed: {terminal.data}")
            if raw is not None:
                assert container is not None
                baseline = raw.timed_exec(container, ["harness-demo"], NOOP.encode())
            else:
                baseline, _ = bare_subprocess([bench.executable("local")], NOOP.encode(), home)
            if i < sizes.overhead_warmup:
                continue
            first = next(e for e in events if e.type == "turn-started")
            out["ours"].append(seen_at - started)
            out["base"].append(baseline)
            out["submit"].append(submitted - started)
            out["dispatch"].append(first.ts - wall)
            out["turn"].append(terminal.ts - first.ts)
            out["deliver"].append(terminal.at - terminal.ts)
    finally:
        if raw is not None:
            raw.close()
        bench.end_run(run_id)
    return out


def run(bench: Bench) -> RowResult:
    result = RowResult("1", "per-turn overhead (no-op turn, warm sandbox)")
    for backend in bench.backends:
        m = measure(bench, backend)
        ours, base = m["ours"], m["base"]
        baseline_name = "bare exec" if backend == "docker" else "bare subprocess"
        for pct in (50, 95):
            o_ms, b_ms = percentile(ours, pct) * 1000, percentile(base, pct) * 1000
            result.add(
                Figure(f"{backend}: submit->terminal p{pct} vs {baseline_name}", o_ms, b_ms, "ms")
            )
        over50 = (p50(ours) - p50(base)) * 1000
        over95 = (percentile(ours, 95) - percentile(base, 95)) * 1000
        result.add(
            Figure(
                f"{backend}: overhead p50 (ours - baseline)",
                over50,
                None,
                "ms",
                target=f"<= {TARGET_MS:g} ms",
                met=over50 <= TARGET_MS,
            ),
            Figure(f"{backend}: overhead p95", over95, None, "ms"),
            Figure(f"{backend}:   submit (client call) p50", p50(m["submit"]) * 1000, None, "ms"),
            Figure(
                f"{backend}:   submit -> turn-started published p50",
                p50(m["dispatch"]) * 1000,
                None,
                "ms",
            ),
            Figure(
                f"{backend}:   turn-started -> terminal published p50",
                p50(m["turn"]) * 1000,
                None,
                "ms",
            ),
            Figure(
                f"{backend}:   terminal published -> seen p50", p50(m["deliver"]) * 1000, None, "ms"
            ),
        )
        result.checks[f"{backend}: every no-op turn ended with turn-complete"] = (
            len(ours) == bench.sizes.overhead_turns
        )
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
