"""Stall diagnostics: the process table of a sandbox and what a stalled turn says."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from sandbox.base import Connection, ExecSpec, ProcessRow, RunSpec, SandboxProcesses
from sandbox.local import LocalSandbox
from sandbox.procs import _address, parse_net_tcp, parse_processes, parse_ps
from worker.store.keys import Keys
from worker.turn.stall import Stall, read_report

PS = """\
    1     0 Ss   00:00:00 tini -- sleep infinity
   17     1 S    00:00:01 /bin/sh /wrapper node /usr/bin/claude -p
   18    17 Rl   01:02:03 node /usr/bin/claude -p
   40    18 D    1-00:00:00 git clone https://example.com/repo
   98     0 S    00:00:00 /bin/sh -c ps -eo pid=,ppid=,stat=,time=,args=; echo '--harness-''procs--'
   99    98 R    00:00:00 ps -eo pid=,ppid=,stat=,time=,args=
"""
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111
   1: 0200000A:C350 5DB8D822:01BB 01 00000000:00000000 00:00000000 00000000  1000        0 222
"""
TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:A000 06 0 0 0 0 0 0 333
"""


def test_ps_rows_carry_state_cpu_time_and_command() -> None:
    rows = parse_ps(PS)
    assert rows[2] == ProcessRow(18, 17, "R", 3723.0, "node /usr/bin/claude -p")
    assert rows[3].cpu_s == 86400.0 and rows[3].state == "D"


def test_net_tcp_lists_connections_not_listeners() -> None:
    assert parse_net_tcp(TCP) == [Connection("10.0.0.2:50000", "34.216.184.93:443", "ESTABLISHED")]
    assert parse_net_tcp(TCP, {"111"}) == []
    assert _address("00000000000000000000000001000000:1F90") == "[::1]:8080"


def test_container_listing_leaves_its_own_ps_out() -> None:
    listed = parse_processes(f"{PS}--harness-procs--\n{TCP}--harness-procs--\n{TCP6}")
    assert listed == parse_processes(f"{PS}--harness-procs--\n{TCP}\n--harness-procs--\n{TCP6}")
    assert [row.pid for row in listed.processes] == [1, 17, 18, 40]
    assert [c.state for c in listed.connections] == ["ESTABLISHED", "TIME_WAIT"]


def test_describe_shows_the_process_tree_then_the_connections() -> None:
    listed = parse_processes(f"{PS}--harness-procs--\n{TCP}--harness-procs--\n")
    assert listed.describe().splitlines() == [
        "processes (pid state cpu command):",
        "  1 S 0.0s tini -- sleep infinity",
        "    17 S 1.0s /bin/sh /wrapper node /usr/bin/claude -p",
        "      18 R 3723.0s node /usr/bin/claude -p",
        "        40 D 86400.0s git clone https://example.com/repo",
        "connections:",
        "  10.0.0.2:50000 -> 34.216.184.93:443 ESTABLISHED",
    ]
    assert SandboxProcesses(()).describe() == "no process is running in the sandbox"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def test_local_sandbox_lists_its_turns_processes_and_their_connections(
    tmp_path: Path, listener: socket.socket
) -> None:
    sandbox = LocalSandbox(tmp_path)
    placement = sandbox.prepare(RunSpec(run_id="r1", image="local"))
    port = listener.getsockname()[1]
    script = (
        "import socket, subprocess, sys, time\n"
        f"s = socket.create_connection(('127.0.0.1', {port}))\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    process = sandbox.start(placement, ExecSpec(argv=(sys.executable, "-c", script)), {})
    try:
        chunk = process.read(10)
        assert chunk is not None and b"ready" in chunk.data
        listed = sandbox.processes("r1")
        commands = [row.command for row in listed.processes]
        assert any("create_connection" in c for c in commands), commands
        assert any("time.sleep(30)" in c and "socket" not in c for c in commands), commands
        parent = next(r for r in listed.processes if "create_connection" in r.command)
        assert parent.pid == process.pid and parent.state in "SR"
        child = next(r for r in listed.processes if r.pid != parent.pid)
        assert child.ppid == parent.pid
        assert [c.remote for c in listed.connections] == [f"127.0.0.1:{port}"]
        assert f"\n    {child.pid} " in listed.describe()  # nested under its parent
    finally:
        process.kill(grace=1)
        sandbox.teardown("r1")
    assert sandbox.processes("r1") == SandboxProcesses((), ())


def test_a_stalled_turn_says_its_last_event_and_what_runs(tmp_path: Path) -> None:
    sandbox = LocalSandbox(tmp_path)
    placement = sandbox.prepare(RunSpec(run_id="r2", image="local"))
    process = sandbox.start(
        placement, ExecSpec(argv=(sys.executable, "-c", "import time; time.sleep(30)")), {}
    )
    redis, keys = fakeredis.FakeRedis(decode_responses=True), Keys("t")
    now = [100.0]
    stall = Stall(
        sandbox, "r2", 3, lambda: ("assistant-text", 90.0),
        redis=redis, keys=keys, report_after_s=5, clock=lambda: now[0],
    )  # fmt: skip
    try:
        # Until the child has exec'd its command line reads as its parent's ("python").
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            "time.sleep(30)" in row.command for row in sandbox.processes("r2").processes
        ):
            time.sleep(0.02)
        text = stall.describe(last_output=95.0)
        assert text.startswith("the last event was assistant-text, 10s ago; the last output 5s ago")
        assert "time.sleep(30)" in text
        stall.watch(last_output=98.0)  # silent 2s: nothing written
        assert read_report(redis, keys, "r2", 3) is None
        stall.watch(last_output=94.0)
        report = read_report(redis, keys, "r2", 3)
        assert report is not None and report["turn"] == 3 and report["silent_s"] == 6.0
        assert report["last_event"] == "assistant-text" and "time.sleep(30)" in str(
            report["processes"]
        )
        assert 0 < redis.ttl(keys.turn_silent("r2", 3)) <= 15
        redis.delete(keys.turn_silent("r2", 3))
        now[0] = 102.0
        stall.watch(last_output=94.0)  # within the interval: not again
        assert read_report(redis, keys, "r2", 3) is None
    finally:
        process.kill(grace=1)
        sandbox.teardown("r2")


def test_no_report_when_reports_are_off(tmp_path: Path) -> None:
    redis, keys = fakeredis.FakeRedis(decode_responses=True), Keys("t")
    stall = Stall(
        LocalSandbox(tmp_path), "r3", 1, lambda: None,
        redis=redis, keys=keys, report_after_s=0, clock=time.monotonic,
    )  # fmt: skip
    stall.watch(last_output=0.0)
    assert read_report(redis, keys, "r3", 1) is None
    assert stall.describe(time.monotonic()).startswith("no event yet; the last output 0s ago")
