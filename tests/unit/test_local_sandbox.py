"""LocalSandbox: environment allowlist, stdin, output streams, process-group kill, teardown."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.base import (
    Egress,
    ExecSpec,
    Placement,
    RunSpec,
    SandboxError,
    StartFailed,
    WarmPool,
)
from sandbox.docker.sandbox import DockerSandbox
from sandbox.local import PIPE_BYTES, LocalProcess, LocalSandbox, _read_meta
from sandbox.small_files import rewrite_in_place
from sandbox.workspace import safe_name
from tests.unit.test_messages import woken_by_a_nudge

RUN = "r0123456789abcdef01234567"


@pytest.fixture
def sandbox(tmp_path: Path) -> LocalSandbox:
    return LocalSandbox(tmp_path / "root")


@pytest.fixture
def placement(sandbox: LocalSandbox) -> Iterator[Placement]:
    placement = sandbox.prepare(RunSpec(run_id=RUN))
    yield placement
    sandbox.teardown(RUN)


def _collect(process: LocalProcess, timeout: float = 10.0) -> tuple[bytes, bytes, int | None]:
    """Read everything until both streams close, then the exit code."""
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while not process.eof:
        assert time.monotonic() < deadline, "process output did not end in time"
        chunk = process.read(0.2)
        if chunk is None:
            continue
        (out if chunk.stream == "stdout" else err).extend(chunk.data)
    return bytes(out), bytes(err), process.wait(timeout)


def _start(
    sandbox: LocalSandbox,
    placement: Placement,
    *argv: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
) -> LocalProcess:
    spec = ExecSpec(argv=argv, stdin=stdin, env=env or {})
    return sandbox.start(placement, spec, secrets or {})


def _gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_environment_is_allowlist_plus_command_env_plus_secrets(
    sandbox: LocalSandbox, placement: Placement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_ONLY_SECRET", "do-not-leak")
    process = _start(
        sandbox,
        placement,
        "/usr/bin/env",
        env={"HARNESS_TURN": "2"},
        secrets={"DEMO_TOKEN": "granted-value"},
    )
    out, _, code = _collect(process)
    assert code == 0
    env = dict(line.split("=", 1) for line in out.decode().splitlines())
    assert set(env) == {"PATH", "HOME", "LANG", "TMPDIR", "HARNESS_TURN", "DEMO_TOKEN"}
    assert env["HOME"] == placement.home
    assert env["TMPDIR"].startswith(placement.workspace)
    assert env["HARNESS_TURN"] == "2"
    assert env["DEMO_TOKEN"] == "granted-value"
    assert "do-not-leak" not in out.decode()


def test_secrets_override_command_env_of_same_name(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    process = _start(
        sandbox,
        placement,
        "/usr/bin/env",
        env={"DEMO_TOKEN": "from-command"},
        secrets={"DEMO_TOKEN": "from-grant"},
    )
    out, _, _ = _collect(process)
    assert b"DEMO_TOKEN=from-grant" in out


def test_process_runs_in_workspace_by_default(sandbox: LocalSandbox, placement: Placement) -> None:
    out, _, _ = _collect(_start(sandbox, placement, "/bin/pwd"))
    assert Path(out.decode().strip()).resolve() == Path(placement.workspace).resolve()


def test_stdin_fed_then_closed(sandbox: LocalSandbox, placement: Placement) -> None:
    data = b"hello \xff world\n" * 20000  # more than a pipe buffer
    out, _, code = _collect(_start(sandbox, placement, "/bin/cat", stdin=data))
    assert code == 0
    assert out == data


def test_stdin_none_closed_at_once(sandbox: LocalSandbox, placement: Placement) -> None:
    started = time.monotonic()
    out, _, code = _collect(_start(sandbox, placement, "/bin/cat", stdin=None), timeout=5)
    assert code == 0
    assert out == b""
    assert time.monotonic() - started < 3


def test_stdout_and_stderr_separated(sandbox: LocalSandbox, placement: Placement) -> None:
    process = _start(sandbox, placement, "/bin/sh", "-c", "echo out; echo err >&2; echo out2")
    out, err, code = _collect(process)
    assert (out, err, code) == (b"out\nout2\n", b"err\n", 0)


def test_exit_code_reported(sandbox: LocalSandbox, placement: Placement) -> None:
    _, _, code = _collect(_start(sandbox, placement, "/bin/sh", "-c", "exit 7"))
    assert code == 7


def test_wait_returns_none_while_running(sandbox: LocalSandbox, placement: Placement) -> None:
    process = _start(sandbox, placement, "/bin/sleep", "30")
    try:
        assert process.wait(0.05) is None
        assert process.read(0.05) is None
        assert not process.eof
    finally:
        process.kill(grace=0.2)


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print(os.getpid(), child.pid, flush=True)
time.sleep(60)
"""


def test_kill_stops_process_group_including_children_ignoring_sigterm(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    process = _start(sandbox, placement, sys.executable, "-c", STUBBORN)
    first = b""
    deadline = time.monotonic() + 10
    while b"\n" not in first:
        assert time.monotonic() < deadline, "the stubborn process never started"
        chunk = process.read(0.2)
        if chunk is not None and chunk.stream == "stdout":
            first += chunk.data
    parent, child = (int(p) for p in first.split())
    grace = 0.5
    started = time.monotonic()
    process.kill(grace=grace)
    assert time.monotonic() - started < grace + 1.5
    assert process.wait(1) is not None
    deadline = time.monotonic() + 3
    while not (_gone(parent) and _gone(child)):
        assert time.monotonic() < deadline, "a process of the group survived kill()"
        time.sleep(0.05)


def test_kill_idempotent(sandbox: LocalSandbox, placement: Placement) -> None:
    process = _start(sandbox, placement, "/bin/sleep", "30")
    process.kill(grace=0.2)
    code = process.wait(1)
    assert code is not None and code < 0
    started = time.monotonic()
    process.kill(grace=0.2)
    assert time.monotonic() - started < 0.2
    assert process.wait(0) == code


def test_kill_idempotent_when_group_had_stubborn_children(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    process = _start(sandbox, placement, sys.executable, "-c", STUBBORN)
    while (chunk := process.read(5)) is not None and chunk.stream != "stdout":
        pass
    process.kill(grace=0.5)
    # Everything in the group got SIGKILL; a second kill has nothing left to wait for, even
    # when an orphaned child lingers as a zombie because nothing reaps it (a container's
    # PID 1 that is not an init, as on this machine).
    started = time.monotonic()
    process.kill(grace=0.5)
    assert time.monotonic() - started < 0.25


def test_kill_after_exit_harmless(sandbox: LocalSandbox, placement: Placement) -> None:
    process = _start(sandbox, placement, "/bin/true")
    _, _, code = _collect(process)
    process.kill(grace=0.2)
    assert process.wait(0) == code == 0


def test_teardown_kills_running_processes(sandbox: LocalSandbox, placement: Placement) -> None:
    process = _start(sandbox, placement, "/bin/sleep", "30")
    sandbox.teardown(RUN)
    assert process.wait(2) is not None


def test_a_turn_left_running_by_a_killed_worker_is_killed_when_the_next_turn_starts(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    abandoned = _start(sandbox, placement, "sh", "-c", "sleep 30 & echo $!; exec sleep 31")
    chunk = abandoned.read(5)
    assert chunk is not None and chunk.stream == "stdout"
    child = int(chunk.data)

    restarted = LocalSandbox(sandbox.root)  # the next worker, which knows nothing of it
    process = _start(restarted, restarted.prepare(RunSpec(run_id=RUN)), "echo", "next")

    assert _collect(process)[::2] == (b"next\n", 0)
    assert abandoned.wait(2) == -9
    deadline = time.monotonic() + 3
    while not _gone(child):
        assert time.monotonic() < deadline, "the earlier turn's child survived"
        time.sleep(0.05)


def test_teardown_removes_run_workspace_and_is_idempotent(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    placement = sandbox.prepare(RunSpec(run_id=RUN))
    workspace = Path(placement.workspace)
    (workspace / "work.txt").write_text("x")
    assert [m.run_id for m in sandbox.managed()] == [RUN]
    sandbox.teardown(RUN)
    assert not workspace.exists()
    assert sandbox.managed() == []
    sandbox.teardown(RUN)
    assert not workspace.exists()


def test_teardown_keeps_workspace_when_asked(sandbox: LocalSandbox) -> None:
    placement = sandbox.prepare(RunSpec(run_id=RUN))
    sandbox.teardown(RUN, keep_workspace=True)
    assert Path(placement.workspace).is_dir()
    assert sandbox.managed() == []


def test_teardown_keeps_durable_workspace(sandbox: LocalSandbox) -> None:
    placement = sandbox.prepare(RunSpec(run_id=RUN, workspace_key="shared-ws"))
    (Path(placement.home) / "session").write_text("kept")
    sandbox.teardown(RUN, keep_workspace=True)
    sandbox.teardown(RUN, keep_workspace=True)
    assert (Path(placement.home) / "session").read_text() == "kept"
    again = sandbox.prepare(RunSpec(run_id="r" + "1" * 24, workspace_key="shared-ws"))
    assert again.workspace == placement.workspace


def test_prepare_idempotent_for_same_run(sandbox: LocalSandbox) -> None:
    first = sandbox.prepare(RunSpec(run_id=RUN))
    (Path(first.workspace) / "keep.txt").write_text("x")
    second = sandbox.prepare(RunSpec(run_id=RUN))
    assert first == second
    assert (Path(second.workspace) / "keep.txt").exists()
    assert Path(second.home).is_dir()
    sandbox.teardown(RUN)


def test_files_written_before_start(sandbox: LocalSandbox, placement: Placement) -> None:
    config = Path(placement.home) / ".config" / "tool" / "settings.json"
    spec = ExecSpec(argv=("/bin/cat", str(config)), files={str(config): '{"a": 1}'})
    out, _, code = _collect(sandbox.start(placement, spec, {}))
    assert (out, code) == (b'{"a": 1}', 0)


@pytest.mark.parametrize(
    "path",
    ["/tmp/harness-escape.txt", "relative/file.txt", "{workspace}/../escape.txt"],
)
def test_files_outside_workspace_refused(
    sandbox: LocalSandbox, placement: Placement, tmp_path: Path, path: str
) -> None:
    target = path.format(workspace=placement.workspace)
    spec = ExecSpec(argv=("/bin/true",), files={target: "x"})
    with pytest.raises(StartFailed):
        sandbox.start(placement, spec, {})
    assert not (Path(placement.workspace).parent / "escape.txt").exists()
    assert not Path("/tmp/harness-escape.txt").exists()


def test_missing_executable_raises_start_failed(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    with pytest.raises(StartFailed, match="no-such-harness"):
        _start(sandbox, placement, "/nonexistent/no-such-harness")


@pytest.mark.parametrize(
    "value", ["..", "../etc", "a/b", "", ".hidden", "a..b", "x" * 200, "a b", "/abs"]
)
def test_safe_name_refuses_traversal_and_odd_names(value: str) -> None:
    with pytest.raises(SandboxError):
        safe_name(value, "run id")


def test_safe_name_accepts_plain_names() -> None:
    assert safe_name("r0123-ab_c.d", "run id") == "r0123-ab_c.d"


@pytest.mark.parametrize("run_id", ["../../etc", "a/b"])
def test_prepare_refuses_unsafe_run_id(sandbox: LocalSandbox, run_id: str) -> None:
    with pytest.raises(SandboxError):
        sandbox.prepare(RunSpec(run_id=run_id))


def test_renew_records_lease(sandbox: LocalSandbox, placement: Placement) -> None:
    sandbox.renew(RUN, 1234.5)
    (found,) = sandbox.managed()
    assert found.run_id == RUN
    assert found.lease_until == 1234.5


def test_secret_not_in_argv_or_files(
    sandbox: LocalSandbox, placement: Placement, tmp_path: Path
) -> None:
    process = _start(
        sandbox, placement, "/bin/sh", "-c", 'echo "$DEMO_TOKEN"', secrets={"DEMO_TOKEN": "s3cr3t"}
    )
    out, _, _ = _collect(process)
    assert out == b"s3cr3t\n"
    for path in (tmp_path / "root").rglob("*"):
        if path.is_file():
            assert b"s3cr3t" not in path.read_bytes()
    assert os.environ.get("DEMO_TOKEN") != "s3cr3t"  # the worker's own environment untouched


def test_optional_abilities_are_protocols_the_backends_declare(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    """The worker asks ``isinstance(sandbox, Egress)`` / ``WarmPool``, never ``getattr``: the
    Docker backend has both (built without a daemon: it connects on first use), the local
    one neither."""
    docker = DockerSandbox(tmp_path / "docker")
    assert isinstance(docker, Egress) and isinstance(docker, WarmPool)
    assert not isinstance(sandbox, Egress) and not isinstance(sandbox, WarmPool)


def test_metadata_rewritten_in_place_reads_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    long = {"run_id": RUN, "pgids": list(range(1000, 1016)), "workspace": "/w"}
    rewrite_in_place(path, json.dumps(long).encode())
    inode = path.stat().st_ino
    short = {"run_id": RUN, "pgids": [7]}
    rewrite_in_place(path, json.dumps(short).encode())  # the old tail is cut off
    assert _read_meta(path) == {"run_id": RUN, "pgids": [7]}
    assert path.stat().st_ino == inode  # rewritten, not replaced
    path.write_bytes(b'{"run_id": "r1", "pgi')  # as a reader may catch it mid-write
    assert _read_meta(path) == {}
    path.write_bytes(b"[1, 2]")
    assert _read_meta(path) == {}


def test_the_harness_writes_into_a_wide_pipe(sandbox: LocalSandbox, placement: Placement) -> None:
    """A flood waits less on the worker's reader thread (docs/performance.md, row 6): the
    harness's stdout is a pipe of PIPE_BYTES, not Linux's 64 KiB."""
    process = _start(sandbox, placement, "sleep", "5")
    try:
        fd = os.open(f"/proc/{process.pid}/fd/1", os.O_WRONLY)
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        finally:
            os.close(fd)
    finally:
        process.kill(grace=0.1)


def test_the_turn_reads_the_pipes_itself_with_no_thread_per_process(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    """A reader thread per stream cost a flood a fifth of its throughput (docs/performance.md,
    row 6): starting a harness starts no thread in the worker."""
    process = _start(sandbox, placement, "/bin/sh", "-c", "sleep 0.5; echo out; echo err >&2")
    time.sleep(0.2)  # a thread the start handed work to has taken it by now
    assert not [t.name for t in threading.enumerate() if str(process.pid) in t.name]
    out, err, code = _collect(process)
    assert (out, err, code) == (b"out\n", b"err\n", 0)


def test_nothing_is_read_ahead_of_the_turn(
    sandbox: LocalSandbox, placement: Placement, tmp_path: Path
) -> None:
    """While the turn does not read, a harness writing more than its pipe holds waits in its
    write: the worker holds none of it (a reader thread used to take 4 MiB ahead)."""
    done = tmp_path / "done"
    script = (
        "import sys; sys.stdout.buffer.write(b'x' * (3 * 1024 * 1024)); sys.stdout.flush(); "
        f"open({str(done)!r}, 'w').close()"
    )
    process = _start(sandbox, placement, sys.executable, "-c", script)
    time.sleep(1.0)
    assert not done.exists()
    out, _, code = _collect(process)
    assert len(out) == 3 * 1024 * 1024 and code == 0 and done.exists()


def test_a_nudge_wakes_a_waiting_read_then_the_output_still_comes(
    sandbox: LocalSandbox, placement: Placement
) -> None:
    process = _start(sandbox, placement, "/bin/sh", "-c", "sleep 1; echo hello")
    assert woken_by_a_nudge(process.read, process.nudge) < 5
    process.nudge()  # one before a read: that read returns at once
    began = time.monotonic()
    assert process.read(10.0) is None and time.monotonic() - began < 5
    out, _, code = _collect(process)
    assert (out, code) == (b"hello\n", 0)


def test_the_pipes_are_closed_once_both_end(sandbox: LocalSandbox, placement: Placement) -> None:
    """A run keeps its turns' processes until its teardown: a finished one holds no fd."""
    before = len(os.listdir("/proc/self/fd"))
    process = _start(sandbox, placement, "/bin/true")
    _collect(process)
    process.nudge()  # after the end: nothing to wake, and no fd written to
    assert process.read(0) is None and process.eof
    assert len(os.listdir("/proc/self/fd")) == before
    popen = process._popen
    assert popen.stdout is not None and popen.stderr is not None
    assert popen.stdout.closed and popen.stderr.closed


def test_a_harness_whose_output_cannot_be_read_is_killed_not_left_running(
    sandbox: LocalSandbox, placement: Placement, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process has started when its pipes' reader is made: a worker out of descriptors
    there must not leave it running unowned. (Running out of descriptors for real would take
    the test's own with it: the failure is injected.)"""

    def no_descriptor(*args: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("sandbox.pipes.os.eventfd", no_descriptor)
    marker = "31.4159"
    with pytest.raises(StartFailed, match="cannot read the output of 'sleep'"):
        _start(sandbox, placement, "sleep", marker)
    running = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _cmdline(pid) == f"sleep\0{marker}\0" and not _gone(int(pid))
    ]
    assert running == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""
