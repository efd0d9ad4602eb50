"""``python -m bench.raw_drain``: the raw big-output baseline, in a process of its own so that
its memory can be read. Runs the harness (a bare subprocess, or a bare exec in a running
container), reads its stdout to the end in 256 KiB reads, counting bytes and newlines and
keeping nothing, and prints JSON: bytes, lines, wall seconds, resident set before and peak.
With ``--parse`` it also parses each line as JSON (orjson, what the worker's stream driver
uses), the least any reader that maps a CLI's JSON lines to events does with them.

    python -m bench.raw_drain INPUT [--container ID] [--parse] -- ARGV...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import orjson

from bench.proc_status import memory_bytes
from bench.relay import docker_output, local_output


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("--container")
    parser.add_argument("--parse", action="store_true")
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()
    stdin = args.input.encode()
    if args.container:
        import bench.docker_raw  # noqa: F401 -- imported before the memory is measured
    Path("/proc/self/clear_refs").write_text("5")
    before = memory_bytes("VmRSS")
    started = time.perf_counter()
    chunks = (
        docker_output(args.container, args.argv, stdin)
        if args.container
        else local_output(args.argv, stdin)
    )
    size = lines = 0
    rest = b""
    for chunk in chunks:
        size += len(chunk)
        lines += chunk.count(b"\n")
        if args.parse:
            *whole, rest = (rest + chunk).split(b"\n")
            for line in whole:
                if line:
                    orjson.loads(line)
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "bytes": size,
                "lines": lines,
                "wall_s": wall,
                "rss_before": before,
                "rss_peak": memory_bytes("VmHWM"),
            }
        )
    )


if __name__ == "__main__":
    main()
