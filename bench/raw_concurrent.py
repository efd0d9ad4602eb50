"""``python -m bench.raw_concurrent``: the raw concurrency baseline, in a process of its own so
that its memory can be read. Starts N bare harness processes at once (subprocesses, or execs
in the given running containers), one thread per process reading its output to the end, and
prints JSON: wall seconds from the first start to the last exit, and this process's resident
set before and at its peak (bytes).

    python -m bench.raw_concurrent INPUT N -- ARGV...
    python -m bench.raw_concurrent INPUT N --containers ID,ID,... -- ARGV...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from pathlib import Path

from bench.proc_status import memory_bytes


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
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if failures:
        raise SystemExit("\n".join(failures[:5]))
    print(json.dumps({"wall_s": wall, "rss_before": before, "rss_peak": memory_bytes("VmHWM")}))


if __name__ == "__main__":
    main()
