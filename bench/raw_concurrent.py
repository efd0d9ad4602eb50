"""``python -m bench.raw_concurrent``: the raw concurrency baseline, in a process of its own so
that its memory can be read. Starts N bare harness processes at once (subprocesses, or execs
in the given running containers), one thread per process reading its output to the end, and
prints JSON: wall seconds from the first start to the last exit, this process's resident
set before and at its peak (bytes), and what the burst cost in CPU: the machine's busy CPU
seconds over the burst (everyone's: the harnesses, and for execs dockerd, containerd, the
shims and runc) and of it the harnesses' own (the containers' cgroups, or this process's
reaped children).

    python -m bench.raw_concurrent INPUT N -- ARGV...
    python -m bench.raw_concurrent INPUT N --containers ID,ID,... -- ARGV...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from pathlib import Path

from bench.density_host import container_cpu_seconds
from bench.machine import busy_cpu_seconds
from bench.proc_status import memory_bytes


def _harness_cpu(containers: list[str]) -> float:
    """The harnesses' CPU so far: the containers' cgroups, else this process's children."""
    if containers:
        return sum(container_cpu_seconds(c) or 0.0 for c in set(containers))
    times = os.times()
    return times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("n", type=int)
    parser.add_argument("--containers", default="")
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()
    stdin = args.input.encode()
    containers = [c for c in args.containers.split(",") if c]
    raw = None
    if containers:
        from bench.docker_raw import RawDocker

        raw = RawDocker()
        raw.api.version()  # connect before the clock starts, as the worker already is
    Path("/proc/self/clear_refs").write_text("5")
    before = memory_bytes("VmRSS")

    failures: list[str] = []

    def one(i: int) -> None:
        try:
            if raw is not None:
                out, _ = raw.exec(containers[i % len(containers)], args.argv, stdin)
            else:
                out = subprocess.run(args.argv, input=stdin, capture_output=True).stdout
            if b'"complete"' not in out:
                failures.append(f"process {i} did not complete: {out[-200:]!r}")
        except Exception as exc:  # noqa: BLE001 -- reported below, the run is void
            failures.append(f"process {i}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.n)]
    harness_before, busy_before = _harness_cpu(containers), busy_cpu_seconds()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    busy, harness = busy_cpu_seconds() - busy_before, _harness_cpu(containers) - harness_before
    if failures:
        raise SystemExit("\n".join(failures[:5]))
    print(
        json.dumps(
            {
                "wall_s": wall,
                "rss_before": before,
                "rss_peak": memory_bytes("VmHWM"),
                "busy_cpu_s": busy,
                "harness_cpu_s": harness,
                "cores": os.cpu_count() or 1,
            }
        )
    )


if __name__ == "__main__":
    main()
