"""Numeric fields of /proc/PID/status: resident set sizes and thread counts of a process."""

from __future__ import annotations

from pathlib import Path


def status_field(field_name: str, pid: int | str = "self") -> int:
    """The field's number as the kernel writes it (kB for the Vm* fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def memory_bytes(field_name: str, pid: int | str = "self") -> int:
    """A Vm* field (VmRSS, VmHWM) in bytes."""
    return status_field(field_name, pid) * 1024
