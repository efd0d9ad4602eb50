"""Row 6: big output. A 100 MB single line, and a 1 GB stream of 1 KiB lines, through a worker
of its own (a fresh process per backend, stream trimmed at 10,000 entries so Redis does not hold the
gigabyte). The worker's resident set may grow by at most BOUND_MIB over its idle size: the
line limit (HARNESS_MAX_LINE_BYTES, 8 MiB) held once while a line is assembled and once
joined, plus the output read ahead of the stream rules. The oversized line must become a
counted drop (the worker's ``stream.lines_dropped`` record), the turn must complete, and
every line of the big stream must be published. Raw baseline: a bare process draining the
same output (256 KiB reads, nothing kept); and, for the big stream, the floor of putting its
events into Redis at all: the same entries by pipelined XADD, as row 2's baseline sends them.

That floor is one entry per line, the default path. Then the alternative a user with such a
harness would take: the same big stream through another fresh worker with
``HARNESS_COALESCE_TEXT_CHARS=COALESCE_CHARS`` (consecutive text read together published as
one entry, no added delay), against a bare drain of its own, with the same memory bound, the
stream entries it wrote, and checks that its ids are contiguous and the text it kept is the
lines in order (the whole turn when the stream still holds it, as at the smaller profiles'
sizes; else what is left of it, the tail up to the last line)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from typing import cast

from bench.consume import MAX_ID, read_turn, wait_terminal, wait_terminal_quietly
from bench.context import NOOP, Bench
from bench.stats import mib
from bench.table import Figure, RowResult
from bench.worker import ROOT, WorkerProcess

BOUND_MIB = 64.0
THROUGHPUT_RATIO = 0.5
"""Issue 28: the 1 GB stream's throughput against a bare drain of the same output; restated
against the floor of putting those entries into Redis at all (pipelined XADD), which is
itself below half a bare drain here (docs/performance.md, row 6). Issue 41: the coalesced
path against a bare drain, restated against a bare drain that also parses each line as JSON
(the least any design that maps a CLI's JSON lines to events does; the worker does it on
one of the machine's cores, beside the harness and Redis)."""
MAXLEN = 10_000
FLOOR_BATCH = 1000
"""Entries per pipeline of the XADD floor, as row 2's baseline."""
COALESCE_CHARS = 32 * 1024
"""The coalesced turn's bound: 32 KiB, the slice the worker feeds through the stream rules
(``FEED_BYTES`` in worker/turn/attempt.py; a read takes up to 256 KiB, eight such entries).
It puts 32 of the 1 KiB lines into an entry, so the per-entry costs (an XADD, its id and
fields, trimming, a consumer's read and parse of one event) are already spread thin and what
is left costs per byte (each line is still parsed as JSON): 100 MB through the local backend
ran at 62-74 MB/s with 16, 32 or 64 KiB alike, so the bound only trades entries (16 KiB
writes twice as many) against their size, and 32 KiB is one a consumer takes in one SSE
frame without noticing.
MAXLEN stays 10,000 entries, so at 1 GB Redis holds up to about 320 MB of this stream."""
PAGE = 200
"""Entries per XRANGE while the coalesced stream is checked (at most ~6 MiB at a time)."""


def _drain(
    bench: Bench, backend: str, script: str, container: str | None, parse: bool = False
) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.raw_drain", script, *(["--parse"] if parse else [])]
    if container:
        argv += ["--container", container, "harness-demo"]
    else:
        argv += ["--", bench.executable("local")]
    out = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=1800)
    return json.loads(out.stdout)


def _line_text(i: int, line: int) -> str:
    """The text of the demo harness's @fill line ``i``: {"type":"text","text":"<10 digits>
    <pad>"} and newline, ``line`` bytes in all."""
    return f"{i:010d} " + "x" * max(0, line - len('{"type":"text","text":"') - len('"}\n') - 11)


def _xadd_floor(bench: Bench, turn: int, count: int, line: int) -> float:
    """Seconds to put the big stream's ``count`` text events into Redis at all: the entries
    the publisher writes for them (ids, type, data, ts, MAXLEN), generated here one batch at a
    time (the gigabyte is never held) and sent as row 2's baseline sends them, pipelined
    XADDs of 1,000 from one Python process, into a scratch stream of the same MAXLEN."""
    import uuid

    from adapters.events import AssistantText

    pad = _line_text(0, line)[11:]
    key = f"{bench.env.prefix}:bench:fill:{uuid.uuid4().hex[:8]}"
    client = bench.redis
    ts = f"{time.time():.6f}"
    client.delete(key)
    started = time.perf_counter()
    for at in range(0, count, FLOOR_BATCH):
        pipe = client.pipeline(transaction=False)
        command = pipe.execute_command
        for i in range(at, min(count, at + FLOOR_BATCH)):
            data = AssistantText(text=f"{i:010d} {pad}").data_json()
            command(
                "XADD", key, "MAXLEN", "~", MAXLEN, f"{turn}-{i + 2}",
                "type", "assistant-text", "data", data, "ts", ts,
            )  # fmt: skip
        pipe.execute()
    seconds = time.perf_counter() - started
    client.delete(key)
    return seconds


def _turn(
    bench: Bench, worker: WorkerProcess, run_id: str, script: str
) -> tuple[int, float, float, int]:
    """Run one turn: (turn, seconds, growth of the worker's peak RSS over idle in MiB, idle)."""
    time.sleep(0.3)
    idle = worker.rss_bytes()
    worker.reset_peak()
    started = time.perf_counter()
    turn = bench.client.submit_turn(run_id, script)
    seen = wait_terminal_quietly(bench.redis, bench.stream(run_id), turn, timeout_s=3600)
    return turn, seen - started, mib(worker.peak_rss_bytes() - idle), idle


def _dropped(worker: WorkerProcess, key: str, turn: int) -> dict[str, int]:
    for record in worker.stream_records():
        if (
            record.get("message") == "stream.lines_dropped"
            and record.get("stream") == key
            and record.get("stream_turn") == turn
        ):
            counters: dict[str, int] = record.get("counters", {})
            return counters
    return {}


def _open_run(bench: Bench, backend: str) -> tuple[str, str | None]:
    """A run with its no-op first turn done: (run id, its container on Docker)."""
    run_id = bench.start_run(backend, NOOP)
    wait_terminal(bench.redis, bench.stream(run_id), 1, timeout_s=120)
    container = bench.client.status(run_id)["container_id"] if backend == "docker" else None
    return run_id, container


def _check_coalesced(bench: Bench, key: str, turn: int, lines: int, line: int) -> tuple[int, str]:
    """The coalesced @fill turn as the stream holds it: (the text entries it wrote, a problem
    or ""). Its seqs run on without a gap from the first entry kept to ``turn-complete``; its
    text entries hold whole lines, in order, each entry at most COALESCE_CHARS, and the last
    ends with the last line; when the turn's first entry is still there, the text starts at
    line 0 and the entries kept are all it wrote. Read a page at a time, nothing held."""
    size = len(_line_text(0, line))
    pad = _line_text(0, line)[11:]
    kinds: list[str] = []  # the types of the entries that are not text, in order
    first_seq = prev_seq = -1
    texts = 0
    following: int | None = None  # the next line expected, once the first text entry is read
    start = f"{turn}-0"
    while True:
        page = cast(
            "list[tuple[str, dict[str, str]]]",
            bench.redis.xrange(key, min=start, max=f"{turn}-{MAX_ID}", count=PAGE),
        )
        for entry_id, fields in page:
            seq = int(entry_id.split("-")[1])
            if prev_seq >= 0 and seq != prev_seq + 1:
                return 0, f"seq {seq} follows {prev_seq}"
            first_seq = seq if first_seq < 0 else first_seq
            prev_seq = seq
            if fields["type"] != "assistant-text":
                kinds.append(fields["type"])
                continue
            text: str = json.loads(fields["data"]).get("text", "")
            count, rest = divmod(len(text), size)
            if rest or not count or len(text) > COALESCE_CHARS:
                return 0, f"entry {entry_id} holds {len(text)} characters"
            if following is None:
                following = int(text[:10])
                if first_seq == 0 and following != 0:
                    return 0, f"the turn's text starts with line {following}"
            expected = "".join([f"{i:010d} {pad}" for i in range(following, following + count)])
            if text != expected:
                return 0, f"entry {entry_id} is not lines {following}-{following + count - 1}"
            following += count
            texts += 1
        if len(page) < PAGE:
            break
        start = f"{turn}-{prev_seq + 1}"
    written = prev_seq - 3  # seqs: turn-started 0, session 1, the text, workspace, terminal
    if kinds[-2:] != ["workspace", "turn-complete"]:
        return written, f"the turn ends with {kinds[-2:]}"
    if following != lines:
        return written, f"the text ends with line {(following or 0) - 1}, not {lines - 1}"
    if first_seq == 0 and (kinds != ["turn-started", "session", "workspace", "turn-complete"]):
        return written, f"the turn's entries other than text: {kinds}"
    if first_seq == 0 and texts != written:
        return written, f"{texts} text entries kept of {written} written"
    return written, ""


def _per_line(bench: Bench, backend: str, result: RowResult) -> None:
    """The oversized line, then the big stream one entry per line (the default)."""
    sizes = bench.sizes
    big, total, line = sizes.bigline_bytes, sizes.bigstream_bytes, sizes.bigstream_line_bytes
    # A fresh process per backend: CPython keeps memory it once used, so a worker that
    # already held a backlog would hide the next one's growth.
    worker = bench.use_worker(HARNESS_STREAM_MAXLEN=str(MAXLEN))
    run_id, container = _open_run(bench, backend)
    key = bench.stream(run_id)
    try:
        # The oversized line.
        script = f"@bigline {big}"
        turn, seconds, growth, idle = _turn(bench, worker, run_id, script)
        entries = read_turn(bench.redis, key, turn)
        types = [fields["type"] for _, fields in entries]
        counters = _dropped(worker, key, turn)
        result.checks[f"{backend}: the {big / 1e6:g} MB line counted as oversized"] = (
            counters.get("oversized") == 1
        )
        expected_types = ["turn-started", "session", "workspace", "turn-complete"]
        result.checks[f"{backend}: its turn completed, nothing of the line published"] = (
            types == expected_types
        )
        if types != expected_types:
            result.notes.append(f"{backend}: the big line's turn published {types}")
        drain = _drain(bench, backend, script, container)
        result.add(
            _memory(
                f"{backend}: {big / 1e6:g} MB line: worker peak RSS growth vs bare drain",
                growth,
                drain,
            ),
            Figure(f"{backend}:   its turn, seconds vs bare drain", seconds, drain["wall_s"], "s"),
        )
        # The big stream of small lines.
        script = f"@fill {total} {line}"
        turn, seconds, growth, _ = _turn(bench, worker, run_id, script)
        expected = math.ceil(total / line)
        # The turn ends: the last text line, the snapshot's workspace event, terminal.
        last = bench.redis.xrevrange(key, count=3)
        (last_id, last_fields), (_, snap_fields), (_, text_fields) = last
        last_text = json.loads(text_fields["data"]).get("text", "")
        complete = (
            last_id == f"{turn}-{expected + 3}"
            and last_fields["type"] == "turn-complete"
            and snap_fields["type"] == "workspace"
            and last_text.startswith(f"{expected - 1:010d} ")
        )
        result.checks[f"{backend}: all {expected:,} lines of the stream published"] = complete
        if not complete:
            result.notes.append(
                f"{backend}: the stream ends with {last_id} {last_fields['type']}, "
                f"{snap_fields['type']}, text {last_text[:20]!r}"
            )
        drain = _drain(bench, backend, script, container)
        ours_rate = total / 1e6 / seconds
        drain_rate = drain["bytes"] / 1e6 / drain["wall_s"]
        xadd_rate = total / 1e6 / _xadd_floor(bench, turn, expected, line)
        result.add(
            _memory(
                f"{backend}: {total / 1e6:g} MB of {line} B lines: worker peak RSS growth"
                " vs bare drain",
                growth,
                drain,
            ),
            _throughput(f"{backend}:   its throughput vs bare drain", ours_rate, drain_rate),
            _throughput(
                f"{backend}:   its throughput vs the same entries by pipelined XADD",
                ours_rate,
                xadd_rate,
                restated=True,
            ),
        )
        result.notes.append(f"{backend}: worker idle RSS {mib(idle):.1f} MiB")
    finally:
        bench.end_run(run_id)


def _throughput(name: str, ours: float, baseline: float, restated: bool = False) -> Figure:
    """A throughput line with the row's ">= 0.5x" target (the issue's, or restated)."""
    target = f">= {THROUGHPUT_RATIO:g}x"
    return Figure(
        name,
        ours,
        baseline,
        "MB/s",
        target=f"restated: {target}" if restated else target,
        met=ours >= THROUGHPUT_RATIO * baseline,
    )


def _memory(name: str, growth: float, drain: dict[str, float]) -> Figure:
    """Worker peak RSS growth against the row's bound, beside the bare drain's."""
    return Figure(
        name,
        growth,
        mib(drain["rss_peak"] - drain["rss_before"]),
        "MiB",
        target=f"<= {BOUND_MIB:g} MiB",
        met=growth <= BOUND_MIB,
    )


def _coalesced(bench: Bench, backend: str, result: RowResult) -> None:
    """The big stream again, through a fresh worker that coalesces text read together."""
    total, line = bench.sizes.bigstream_bytes, bench.sizes.bigstream_line_bytes
    worker = bench.use_worker(
        HARNESS_STREAM_MAXLEN=str(MAXLEN), HARNESS_COALESCE_TEXT_CHARS=str(COALESCE_CHARS)
    )
    run_id, container = _open_run(bench, backend)
    key = bench.stream(run_id)
    try:
        script = f"@fill {total} {line}"
        turn, seconds, growth, _ = _turn(bench, worker, run_id, script)
        expected = math.ceil(total / line)
        written, problem = _check_coalesced(bench, key, turn, expected, line)
        result.checks[
            f"{backend}: coalesced: all {expected:,} lines published in order, ids contiguous"
        ] = not problem
        if problem:
            result.notes.append(f"{backend}: the coalesced stream: {problem}")
        drain = _drain(bench, backend, script, container)
        parsing = _drain(bench, backend, script, container, parse=True)
        ours_rate = total / 1e6 / seconds
        drain_rate = drain["bytes"] / 1e6 / drain["wall_s"]
        parsing_rate = parsing["bytes"] / 1e6 / parsing["wall_s"]
        result.add(
            _memory(
                f"{backend}: the same, coalesced ({COALESCE_CHARS // 1024} KiB): worker peak RSS"
                " growth vs bare drain",
                growth,
                drain,
            ),
            _throughput(f"{backend}:   its throughput vs bare drain", ours_rate, drain_rate),
            _throughput(
                f"{backend}:   its throughput vs a bare drain that parses each line",
                ours_rate,
                parsing_rate,
                restated=True,
            ),
            Figure(
                f"{backend}:   its stream entries vs one per line",
                float(written),
                float(expected),
                "entries",
            ),
        )
    finally:
        bench.end_run(run_id)


def run(bench: Bench) -> RowResult:
    sizes = bench.sizes
    big, total = sizes.bigline_bytes, sizes.bigstream_bytes
    result = RowResult("6", f"big output ({big / 1e6:g} MB line, {total / 1e6:g} MB of lines)")
    try:
        for backend in bench.backends:
            _per_line(bench, backend, result)
            _coalesced(bench, backend, result)
    finally:
        bench.stop_worker()
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    return result
