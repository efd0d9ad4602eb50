"""Row 15: the control features (steer, fork, attempts), each against the raw cost of the
same work measured in the same run, with real Redis, a real worker and Docker:

1. steer: a running turn (``--posture ask``, the demo's ``@stamp-messages``: each message
   line answered with the wall clock it was read at) gets ``HarnessClient.steer(run_id,
   text, mode="steer")``, one message at a time; latency = the harness's stamp - the clock
   just before the call. Baseline: the same line written by ``Process.write`` to the stdin of
   the same harness started with ``keep_stdin`` through the same Docker backend (its own
   container), stamped the same way. Messages alternate between the two;
2. fork of a run whose workspace holds a tree of :func:`bench.row7_workspace.make_tree`'s:
   ``HarnessClient.fork`` -> the fork's ``turn-started`` (published once its workspace is
   seeded and its container is up), minus a new run's ``start_run`` -> ``turn-started`` (the
   container and the turn's start, which any run pays), against ``git worktree add`` of the
   same tree committed in a plain repository on the same disk. Where the time goes is
   measured piece by piece: the parent's export (``HarnessClient.export``), the archive's
   upload through Redis, its unpack and snapshot turn 0 (``seed_from_archive``, in process);
3. 8 attempts of a no-op turn (``start_attempts``) -> all 8 terminals seen, against the
   floor: one attempt's wall plus 8 containers of the demo image started at once through the
   Docker backend (``DockerSandbox.prepare``, a thread each, released together).

Nothing is timed against a limit here: the row prints figures, ratios and verdicts.
``python -m bench.row15_control [--profile full|quick|smoke] [--markdown]`` runs it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import row7_workspace
from bench.consume import before_turn, wait_terminal
from bench.row7_workspace import OWNER, make_tree
from bench.stats import p50, percentile
from bench.table import Figure, RowResult, render_markdown, render_text
from bench.worker import DEMO_IMAGE
from sandbox.base import ExecSpec, Process, RunSpec
from sandbox.store.seeding import ArchiveLimits, seed_from_archive
from sandbox.store.snapshots import SnapshotStore

if TYPE_CHECKING:
    import redis

    from bench.context import Bench
    from sandbox.docker.sandbox import DockerSandbox

NOOP = "@complete ok"
STEER_P50_MS = 20.0
FORK_RATIO = 1.2
ATTEMPTS_RATIO = 1.15
WARMUP_MESSAGES = 3
MESSAGE_WAIT_S = 60


@dataclass(frozen=True)
class Sizes:
    messages: int
    """Target 1: timed messages each way (after :data:`WARMUP_MESSAGES`)."""
    files: int
    fork_repeats: int
    """Target 2: the tree's files; forks, new runs and worktrees each."""
    attempts: int
    attempt_repeats: int
    """Target 3: attempts per group; groups, single attempts and bursts each."""


SIZES = {
    "full": Sizes(50, 10_000, 5, 8, 3),
    "quick": Sizes(30, 10_000, 3, 8, 2),
    "smoke": Sizes(4, 200, 1, 2, 1),
}


# -- reading the streams -----------------------------------------------------------------------


def _events_of(client: redis.Redis, key: str, cursor: str, block_ms: int) -> list[Any]:
    reply: Any = client.xread({key: cursor}, count=1000, block=block_ms)
    return list(reply[0][1]) if reply else []


def _wait_event(client: redis.Redis, key: str, kind: str, turn: int, timeout_s: float) -> float:
    """Wall clock when this consumer saw the turn's first event of ``kind``."""
    cursor, deadline = before_turn(turn), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry_id, fields in _events_of(client, key, cursor, 1000):
            cursor = entry_id
            if fields["type"] == kind and int(entry_id.split("-")[0]) == turn:
                return time.time()
    raise TimeoutError(f"no {kind} in turn {turn} of {key} within {timeout_s:g}s")


def _start_and_end(client: redis.Redis, key: str, turn: int = 1) -> tuple[float, float, str]:
    """Wall clocks when the turn's ``turn-started`` and its terminal were seen; its type."""
    _, seen = wait_terminal(client, key, turn, timeout_s=300)
    started = next(e.at for e in seen if e.type == "turn-started")
    return started, seen[-1].at, seen[-1].type


def _stamp(text: str, expected: str) -> float | None:
    """The harness's clock in a ``TIME message: TEXT`` line for ``expected``, else None."""
    stamp, _, said = text.partition(" message: ")
    if said != expected:
        return None
    try:
        return float(stamp)
    except ValueError:
        return None


# -- 1. steer -------------------------------------------------------------------------------------


class _SteeredTurn:
    """Our side: one turn taking every message, read back from its stream."""

    def __init__(self, bench: Bench, count: int) -> None:
        self.bench = bench
        self.run_id = bench.start_run(
            "docker", f"@stamp-messages {count} {MESSAGE_WAIT_S}", posture="ask"
        )
        self.key = bench.stream(self.run_id)
        self.reader = bench.env.redis()
        _wait_event(self.reader, self.key, "session", 1, 120)  # the harness reads its stdin
        self.cursor = before_turn(1)
        self.states: list[str] = []
        self.call_s: list[float] = []

    def send(self, text: str) -> float:
        """Seconds from just before ``steer`` to the harness reading the line."""
        started = time.time()
        answer = self.bench.client.steer(self.run_id, text, mode="steer")
        self.call_s.append(time.time() - started)
        self.states.append(str(answer.get("state")))
        deadline = time.monotonic() + MESSAGE_WAIT_S
        while time.monotonic() < deadline:
            for entry_id, fields in _events_of(self.reader, self.key, self.cursor, 1000):
                self.cursor = entry_id
                if fields["type"] != "assistant-text":
                    continue
                stamp = _stamp(str(json.loads(fields["data"]).get("text", "")), text)
                if stamp is not None:
                    return stamp - started
        raise TimeoutError(f"the turn never answered {text!r}")

    def finish(self) -> str:
        _, seen = wait_terminal(self.reader, self.key, 1, cursor=self.cursor, timeout_s=120)
        self.reader.close()
        return str(seen[-1].type)


class _RawProcess:
    """The baseline: the same harness, started with ``keep_stdin`` by the Docker backend in a
    container of its own, a message line written with ``Process.write``."""

    def __init__(self, sandbox: DockerSandbox, count: int) -> None:
        self.sandbox = sandbox
        self.run_id = "b15raw" + uuid.uuid4().hex[:8]
        placement = sandbox.prepare(RunSpec(run_id=self.run_id, image=DEMO_IMAGE))
        line = {"type": "input", "text": f"@stamp-messages {count} {MESSAGE_WAIT_S}"}
        spec = ExecSpec(
            argv=("harness-demo",),
            stdin=json.dumps(line).encode() + b"\n",
            env={"HARNESS_POSTURE": "ask", "HOME": placement.home},
            keep_stdin=True,
        )
        self.process: Process = sandbox.start(placement, spec, {})
        self.buffer = b""
        self._line_until(lambda said: said.get("type") == "session")

    def _line_until(self, wanted: Any) -> dict[str, Any]:
        deadline = time.monotonic() + MESSAGE_WAIT_S
        while time.monotonic() < deadline:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    said = json.loads(raw)
                    if isinstance(said, dict) and wanted(said):
                        return said
            chunk = self.process.read(1.0)
            if chunk is not None and chunk.stream == "stdout":
                self.buffer += chunk.data
            elif chunk is None and self.process.eof:
                break
        raise TimeoutError("the raw harness stopped answering")

    def send(self, text: str) -> float:
        line = json.dumps({"type": "message", "text": text, "mode": "steer"}).encode() + b"\n"
        started = time.time()
        if not self.process.write(line):
            raise RuntimeError("the raw harness's stdin is closed")
        said = self._line_until(
            lambda s: s.get("type") == "text" and _stamp(str(s.get("text")), text) is not None
        )
        stamp = _stamp(str(said["text"]), text)
        assert stamp is not None
        return stamp - started

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.process.close_stdin()
            self.process.wait(10)
            self.process.kill()
        self.sandbox.teardown(self.run_id)


def _steer(bench: Bench, result: RowResult, sandbox: DockerSandbox, sizes: Sizes) -> None:
    total = sizes.messages + WARMUP_MESSAGES
    ours = _SteeredTurn(bench, total)
    raw = _RawProcess(sandbox, total)
    mine: list[float] = []
    base: list[float] = []
    try:
        for i in range(total):
            theirs_s = raw.send(f"raw {i}")
            ours_s = ours.send(f"steer {i}")
            if i >= WARMUP_MESSAGES:
                base.append(theirs_s)
                mine.append(ours_s)
        ending = ours.finish()
    finally:
        raw.close()
        bench.end_run(ours.run_id)
    result.checks[f"steer: all {total} messages reached the running turn (sent-to-turn)"] = (
        all(state == "sent-to-turn" for state in ours.states) and len(ours.states) == total
    )
    result.checks["steer: the steered turn completed"] = ending == "turn-complete"
    ms = 1000.0
    ours_p50, base_p50 = p50(mine) * ms, p50(base) * ms
    result.add(
        Figure(
            "steer: call -> harness reads the line p50 vs a raw Process.write",
            ours_p50,
            base_p50,
            "ms",
            f"<= {STEER_P50_MS:g} ms p50",
            ours_p50 <= STEER_P50_MS,
        ),
        Figure(
            "steer: call -> harness reads the line p99",
            percentile(mine, 99) * ms,
            percentile(base, 99) * ms,
            "ms",
        ),
        Figure("  added p50 (steer - raw write)", ours_p50 - base_p50, None, "ms"),
        Figure(
            "  the steer() call itself p50", p50(ours.call_s[WARMUP_MESSAGES:]) * ms, None, "ms"
        ),
    )
    result.notes.append(
        f"steer: {len(mine)} messages each way (after {WARMUP_MESSAGES} warm-up ones), one at "
        "a time, alternating; one turn takes them all (@stamp-messages); the raw harness runs "
        "in a container of its own started by the same Docker backend in this process"
    )


# -- 2. fork --------------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> float:
    """Seconds a git command takes, run as row 7 runs it (no user or system config)."""
    started = time.perf_counter()
    row7_workspace._git(cwd, *args)
    return time.perf_counter() - started


def _files_in(folder: Path) -> int:
    count = 0
    for _, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in (".home", ".git")]
        count += sum(name != ".git" for name in files)  # a worktree's .git is a file
    return count


@dataclass
class _ForkTimes:
    fork_started: list[float]
    fork_done: list[float]
    fork_call: list[float]
    new_started: list[float]
    new_done: list[float]
    worktree: list[float]
    export: list[float]
    upload: list[float]
    unpack: list[float]
    tar_create: list[float]
    tar_extract: list[float]


def _fork(bench: Bench, result: RowResult, sizes: Sizes) -> None:
    base = bench.tmp / "row15-fork"
    shutil.rmtree(base, ignore_errors=True)
    tree, repo = base / "tree", base / "repo"
    make_tree(tree, sizes.files)
    make_tree(repo, sizes.files)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    seed = base / "seed.tar.gz"
    subprocess.run(["tar", "-czf", str(seed), "-C", str(tree), "."], check=True)
    parent = bench.start_run("docker", NOOP, archive=str(seed))
    reader = bench.env.redis()
    times = _ForkTimes([], [], [], [], [], [], [], [], [], [], [])
    whole, completed = True, True
    workspaces = Path(bench.env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker" / "run"
    try:
        completed &= _start_and_end(reader, bench.stream(parent))[2] == "turn-complete"
        whole &= _files_in(workspaces / parent) == sizes.files
        for r in range(sizes.fork_repeats):
            started = time.time()
            fresh = bench.start_run("docker", NOOP)
            seen, done, kind = _start_and_end(reader, bench.stream(fresh))
            times.new_started.append(seen - started)
            times.new_done.append(done - started)
            completed &= kind == "turn-complete"
            bench.end_run(fresh)

            started = time.time()
            fork = bench.client.fork(parent, NOOP)
            times.fork_call.append(time.time() - started)
            seen, done, kind = _start_and_end(reader, bench.stream(fork))
            times.fork_started.append(seen - started)
            times.fork_done.append(done - started)
            completed &= kind == "turn-complete"
            whole &= _files_in(workspaces / fork) == sizes.files
            bench.end_run(fork)

            worktree = base / f"worktree{r}"
            times.worktree.append(_git(repo, "worktree", "add", "-q", "--detach", str(worktree)))
            whole &= _files_in(worktree) == sizes.files
            _git(repo, "worktree", "remove", "--force", str(worktree))
            _pieces(bench, parent, base, r, times)
            _tar(repo, base, r, times)
    finally:
        reader.close()
        bench.end_run(parent)
    result.checks[f"fork: every fork's workspace holds the {sizes.files:,} files"] = whole
    result.checks["fork: the parent, every fork and every new run completed"] = completed
    _fork_figures(result, sizes, times, seed.stat().st_size)
    shutil.rmtree(base, ignore_errors=True)


def _pieces(bench: Bench, parent: str, base: Path, r: int, times: _ForkTimes) -> None:
    """Where a fork's time goes, each piece timed alone: the parent's export from its host,
    the archive's upload through Redis, its unpack and snapshot turn 0 (in this process)."""
    archive = base / f"export{r}.tar.gz"
    started = time.perf_counter()
    bench.client.export(parent, archive)
    times.export.append(time.perf_counter() - started)
    scratch = f"b15up{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    bench.client.workspace.upload_archive(scratch, archive)
    times.upload.append(time.perf_counter() - started)
    bench.redis.delete(bench.env.keys.upload(scratch))
    root = base / f"unpack{r}"
    workspace = root / "run" / "u"
    (workspace / ".home").mkdir(parents=True)
    started = time.perf_counter()
    store = SnapshotStore(root, "u")
    seed_from_archive(store, workspace, archive, ArchiveLimits(), *OWNER)
    times.unpack.append(time.perf_counter() - started)
    store.release()
    shutil.rmtree(root, ignore_errors=True)
    archive.unlink()


def _tar(repo: Path, base: Path, r: int, times: _ForkTimes) -> None:
    """The pieces' floors: ``tar -czf`` of the tree, ``tar -xzf`` of that archive."""
    archive, target = base / f"bare{r}.tar.gz", base / f"bare{r}"
    target.mkdir()
    for argv, into in (
        (["tar", "-czf", str(archive), "--exclude=.git", "-C", str(repo), "."], times.tar_create),
        (["tar", "-xzf", str(archive), "-C", str(target)], times.tar_extract),
    ):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        into.append(time.perf_counter() - started)
    shutil.rmtree(target, ignore_errors=True)
    archive.unlink()


def _fork_figures(result: RowResult, sizes: Sizes, times: _ForkTimes, seed_bytes: int) -> None:
    ms = 1000.0
    net = p50([f - n for f, n in zip(times.fork_started, times.new_started, strict=True)]) * ms
    worktree = p50(times.worktree) * ms
    files = f"{sizes.files:,}"
    result.add(
        Figure(
            f"fork, {files} files: fork() -> its turn-started, minus a new run's, "
            "p50 vs git worktree add",
            net,
            worktree,
            "ms",
            f"<= {FORK_RATIO:g}x",
            net <= FORK_RATIO * worktree,
        ),
        Figure(
            "  fork() -> turn-started p50 vs a new run's start_run -> turn-started",
            p50(times.fork_started) * ms,
            p50(times.new_started) * ms,
            "ms",
        ),
        Figure(
            "  fork() -> terminal (no-op turn) p50 vs a new run's",
            p50(times.fork_done) * ms,
            p50(times.new_done) * ms,
            "ms",
        ),
        Figure(
            "  the fork() call (export, upload, record) p50", p50(times.fork_call) * ms, None, "ms"
        ),
        Figure(
            "    export of the parent from its host p50 vs tar -czf",
            p50(times.export) * ms,
            p50(times.tar_create) * ms,
            "ms",
        ),
        Figure("    upload of the archive through Redis p50", p50(times.upload) * ms, None, "ms"),
        Figure(
            "    unpack + snapshot turn 0 (seed_from_archive) p50 vs tar -xzf",
            p50(times.unpack) * ms,
            p50(times.tar_extract) * ms,
            "ms",
        ),
    )
    result.notes.append(
        f"fork: {len(times.worktree)} repeats, each a new no-op run, a fork of the parent "
        f"(seeded from a {seed_bytes / 1e6:.1f} MB tar.gz of the {files} files, no-op first "
        "turn) and a git worktree add of the same tree in a plain repository, in turn; the "
        "pieces (export, upload, unpack) timed alone after each"
    )


# -- 3. attempts ----------------------------------------------------------------------------------


def _all_terminals(client: redis.Redis, keys: list[str], timeout_s: float = 300) -> list[str]:
    """Block until every stream's turn 1 has its terminal; their types."""
    cursors = {key: "0-0" for key in keys}
    ended: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(ended) < len(keys):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(keys) - len(ended)} attempts did not end")
        waiting = {k: c for k, c in cursors.items() if k not in ended}
        reply: Any = client.xread(waiting, count=1000, block=1000)  # type: ignore[arg-type]
        for key, entries in reply or []:
            for entry_id, fields in entries:
                cursors[key] = entry_id
                if fields["type"] in ("turn-complete", "session-error"):
                    ended[key] = fields["type"]
    return list(ended.values())


def _group(bench: Bench, count: int) -> tuple[float, float, bool]:
    """Wall seconds from ``start_attempts`` to all its terminals seen, of the call itself;
    whether all completed."""
    reader = bench.env.redis()
    started = time.perf_counter()
    group = bench.client.start_attempts(
        "stdio-json", NOOP, attempts=count, executable="harness-demo", sandbox="docker",
        network="none",
    )  # fmt: skip
    call = time.perf_counter() - started
    kinds = _all_terminals(reader, [bench.stream(r) for r in group["runs"]])
    wall = time.perf_counter() - started
    reader.close()
    _end_all(bench, group["runs"])
    return wall, call, len(kinds) == count and all(k == "turn-complete" for k in kinds)


def _end_all(bench: Bench, runs: list[str]) -> None:
    threads = [threading.Thread(target=bench.end_run, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _containers_at_once(sandbox: DockerSandbox, count: int) -> float:
    """Wall seconds from the release to the last of ``count`` containers started."""
    ids = [f"b15c{uuid.uuid4().hex[:8]}" for _ in range(count)]
    gate = threading.Barrier(count + 1)
    ends = [0.0] * count
    errors: list[BaseException] = []

    def one(index: int) -> None:
        gate.wait()
        try:
            sandbox.prepare(RunSpec(run_id=ids[index], image=DEMO_IMAGE))
        except BaseException as exc:  # noqa: BLE001 -- reported after the join
            errors.append(exc)
        ends[index] = time.perf_counter()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    gate.wait()
    released = time.perf_counter()
    for thread in threads:
        thread.join()
    for run_id in ids:
        sandbox.teardown(run_id)
    if errors:
        raise errors[0]
    return max(ends) - released


def _attempts(bench: Bench, result: RowResult, sandbox: DockerSandbox, sizes: Sizes) -> None:
    n = sizes.attempts
    groups: list[float] = []
    singles: list[float] = []
    bursts: list[float] = []
    calls: list[float] = []
    completed = True
    _group(bench, 1)  # warm: the worker's Docker client, the image's layers in the page cache
    for _ in range(sizes.attempt_repeats):
        wall, call, ok = _group(bench, n)
        groups.append(wall)
        calls.append(call)
        completed &= ok
        wall, _, ok = _group(bench, 1)
        singles.append(wall)
        completed &= ok
        bursts.append(_containers_at_once(sandbox, n))
    result.checks[f"attempts: every attempt of every group completed ({n} and 1)"] = completed
    ours, single, burst = p50(groups), p50(singles), p50(bursts)
    floor = single + burst
    result.add(
        Figure(
            f"{n} attempts of a no-op turn: start -> all {n} terminals p50 vs the floor",
            ours,
            floor,
            "s",
            f"<= {ATTEMPTS_RATIO:g}x",
            ours <= ATTEMPTS_RATIO * floor,
        ),
        Figure(f"  the start_attempts() call of {n} p50", p50(calls), None, "s"),
        Figure("  one attempt: start -> its terminal p50", single, None, "s"),
        Figure(f"  {n} containers started at once (DockerSandbox.prepare) p50", burst, None, "s"),
    )
    result.notes.append(
        f"attempts: {len(groups)} groups of {n} and of 1, and {len(bursts)} bursts of {n} "
        "container starts, in turn, medians; the floor is one attempt's wall plus the burst's"
    )


# -- the row --------------------------------------------------------------------------------------


def run(bench: Bench) -> RowResult:
    sizes = SIZES.get(bench.profile, SIZES["full"])
    result = RowResult("15", "control: steer, fork, attempts (Docker)")
    if "docker" not in bench.backends:
        result.skipped = bench.docker_skip or "the docker backend was not asked for"
        return result
    from sandbox.docker.sandbox import DockerSandbox

    load = os.getloadavg()
    _ = bench.worker
    sandbox = DockerSandbox(bench.tmp / "row15-docker", scope=bench.env.scope)
    _steer(bench, result, sandbox, sizes)
    _fork(bench, result, sizes)
    _attempts(bench, result, sandbox, sizes)
    after = os.getloadavg()
    result.notes.append(
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start, "
        f"{after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f} at the end ({os.cpu_count()} CPUs)"
    )
    return result


class _WithFields(logging.Formatter):
    """A log record's message with the fields it was given (the backend's warnings say what
    failed in them)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k in ("run_id", "error", "step")}
        return f"{record.getMessage()} {fields}" if fields else record.getMessage()


def main(argv: list[str]) -> int:
    from bench.context import Bench

    parser = argparse.ArgumentParser(prog="python -m bench.row15_control")
    parser.add_argument("--profile", choices=tuple(SIZES), default="full")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_WithFields())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    with Bench(args.profile, backends=("docker",)) as bench:
        result = run(bench)
    print(render_text([result]))
    if args.markdown:
        print("\n" + render_markdown([result]))
    return 0 if all(result.checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
