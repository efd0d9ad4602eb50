"""What runs in a sandbox: a process table and open TCP connections, read from ``/proc``
(the local backend) or from ``ps`` and ``/proc/net`` inside a container (the Docker one),
and the one text both render for a stalled turn's diagnosis."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from sandbox.base import Connection, ProcessRow, SandboxProcesses

TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}
PS_FORMAT = "pid=,ppid=,stat=,time=,args="
"""``ps -eo`` columns a container is asked for (procps and busybox both know them)."""


def parse_ps(text: str) -> list[ProcessRow]:
    """Rows of ``ps -eo`` :data:`PS_FORMAT` output (``time`` as ``[[DD-]HH:]MM:SS``)."""
    rows = []
    for line in text.splitlines():
        parts = line.split(None, 4)
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        pid, ppid, stat, cputime = parts[:4]
        command = parts[4] if len(parts) > 4 else ""
        rows.append(ProcessRow(int(pid), int(ppid), stat[:1], _cpu_seconds(cputime), command))
    return rows


def _cpu_seconds(text: str) -> float:
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part or 0)
    return seconds + (int(days) * 86400 if days.isdigit() else 0)


def parse_net_tcp(text: str, inodes: set[str] | None = None) -> list[Connection]:
    """Connections of ``/proc/net/tcp`` or ``tcp6`` text (those whose socket inode is in
    ``inodes`` when given); listening sockets left out."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] == "0A":
            continue
        if inodes is not None and fields[9] not in inodes:
            continue
        found.append(
            Connection(_address(fields[1]), _address(fields[2]), TCP_STATES.get(fields[3], "?"))
        )
    return found


def _address(text: str) -> str:
    """``0100007F:1F90`` (host byte order, as the kernel prints it) as ``127.0.0.1:8080``."""
    raw, _, port = text.partition(":")
    packed = bytes.fromhex(raw)
    # Each 32-bit word is in the host's order (little-endian on the machines we run on).
    words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
    address = ipaddress.ip_address(words)
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{shown}:{int(port, 16)}"


def read_group(pgids: Iterable[int], proc: Path = Path("/proc")) -> SandboxProcesses:
    """The processes of these process groups and their TCP connections, from ``/proc`` (the
    local backend: the groups its turns started)."""
    wanted = set(pgids)
    rows: list[ProcessRow] = []
    sockets: set[str] = set()
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            head, _, rest = (entry / "stat").read_text().rpartition(")")
            fields = rest.split()
            if int(fields[2]) not in wanted:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip()
            command = cmdline.decode(errors="replace") or head.partition("(")[2]
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            rows.append(ProcessRow(int(entry.name), int(fields[1]), fields[0], cpu, command))
            sockets |= _socket_inodes(entry)
        except (OSError, ValueError, IndexError):
            continue  # it exited while we looked
    connections: list[Connection] = []
    for name in ("tcp", "tcp6"):
        try:
            connections += parse_net_tcp((proc / "net" / name).read_text(), sockets)
        except OSError:
            continue
    return SandboxProcesses(tuple(rows), tuple(connections))


def _socket_inodes(entry: Path) -> set[str]:
    found = set()
    try:
        for fd in (entry / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


_SECTION = "--harness-procs--"
# Quoted apart in the script, so that the line ps prints for the script itself (its args)
# does not hold the separator.
_LISTING = (
    f"ps -eo {PS_FORMAT} || exit; echo '--harness-''procs--'; cat /proc/net/tcp 2>/dev/null; "
    "echo '--harness-''procs--'; cat /proc/net/tcp6 2>/dev/null"
)


def processes_argv() -> list[str]:
    """A container's process table and TCP connections, as one exec's stdout."""
    return ["/bin/sh", "-c", _LISTING]


def parse_processes(text: str) -> SandboxProcesses:
    """What :func:`processes_argv` printed, without the listing's own processes."""
    ps, _, rest = text.partition(f"\n{_SECTION}\n")
    tcp, _, tcp6 = rest.partition(f"\n{_SECTION}\n")
    rows = [row for row in parse_ps(ps) if PS_FORMAT not in row.command]
    connections = [*parse_net_tcp(tcp.strip("\n")), *parse_net_tcp(tcp6.strip("\n"))]
    return SandboxProcesses(tuple(rows), tuple(connections))
