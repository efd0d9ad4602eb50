"""``python -m bench [--quick] [--only ROW[,ROW...]] [--sandbox docker|local|both]``

Runs the rows of issue 8 in one process against a real worker with its own key prefix, and
prints one table: our figure, the raw baseline measured in the same run, the ratio, the
target and whether it was met. ``--json FILE`` also writes every figure; ``--markdown``
prints the table as Markdown (for docs/performance.md). Needs Redis (HARNESS_BENCH_REDIS_URL,
default redis://127.0.0.1:6379/0); the Docker lines need dockerd and the demo image
(scripts/build-images --only demo) and are skipped, with a note, without them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from bench.context import Bench
from bench.machine import describe
from bench.table import RowResult, render_markdown, render_text
from bench.worker import REDIS_URL

ROWS = {
    "1": "bench.row1_overhead",
    "2": "bench.row2_throughput",
    "3": "bench.row3_latency",
    "4": "bench.row4_concurrency",
    "5": "bench.row5_first_turn",
    "6": "bench.row6_big_output",
    "7": "bench.row7_workspace",
    "8": "bench.row8_spend",
    "9": "bench.row9_egress",
    "10": "bench.row10_redis",
    "11": "bench.row11_tracing",
    "12": "bench.row12_api",
    "13": "bench.row13_tools",
    "14": "bench.row14_model_gateway",
    "15": "bench.row15_control",
    "16": "bench.row16_http_path",
    "17": "bench.row17_density",
}


def run_rows(bench: Bench, rows: list[str], *, progress: bool = True) -> list[RowResult]:
    results = []
    for row in rows:
        started = time.monotonic()
        if progress:
            print(f"row {row} ...", file=sys.stderr, flush=True)
        module = importlib.import_module(ROWS[row])
        # What the last row left for the collector is collected now, not in this row's
        # timed loops (row 7's manifests cost row 8 a few hundredths in full runs).
        gc.collect()
        try:
            results.append(module.run(bench))
        except Exception as exc:  # noqa: BLE001 -- a row that fails is reported, the rest run
            traceback.print_exc()
            failed = RowResult(row, "raised before it finished")
            failed.checks[f"row {row} ran to its end"] = False
            failed.notes.append(f"row {row}: {type(exc).__name__}: {exc}")
            results.append(failed)
        if progress:
            print(f"row {row} done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Issue 8's benchmarks: our figures against raw baselines, in one table.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes (same as --profile quick)"
    )
    parser.add_argument(
        "--profile",
        choices=("full", "quick", "smoke"),
        default="full",
        help="sizes: full (issue 8's), quick, smoke (tiny: the tests' sizes)",
    )
    parser.add_argument("--only", default="", help="rows to run, e.g. 1 or 2,3 (default: all)")
    parser.add_argument(
        "--sandbox", choices=("docker", "local", "both"), default="both", help="default: both"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.only.split(",") if r.strip()] or list(ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}: choose from {', '.join(ROWS)}")
    backends = ("docker", "local") if args.sandbox == "both" else (args.sandbox,)
    machine = describe(REDIS_URL)
    profile = "quick" if args.quick else args.profile
    with Bench(profile, backends=backends) as bench:
        results = run_rows(bench, rows)
    print(" | ".join(f"{k}: {v}" for k, v in machine.items()))
    print(f"profile: {profile}\n")
    print(render_markdown(results) if args.markdown else render_text(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "profile": profile, "rows": [r.as_dict() for r in results]},
                indent=2,
            )
        )
    failed = [name for r in results for name, ok in r.checks.items() if not ok]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
