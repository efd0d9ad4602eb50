"""What many runs cost the host outside the worker: their containers' cgroup memory, the
containerd shims that hold them, and the Docker daemons' own growth (row 17)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandbox.base import LABEL_RUN, LABEL_SCOPE

CGROUP = Path("/sys/fs/cgroup")


def scope_containers(scope: str) -> list[dict[str, Any]]:
    """Every container of a scope, running or not, as the daemon lists them (one call; the
    SDK's ``containers.list`` would inspect each)."""
    from docker.client import from_env

    client = from_env(timeout=60)
    try:
        found: list[dict[str, Any]] = client.api.containers(
            all=True, filters={"label": f"{LABEL_SCOPE}={scope}"}
        )
        return found
    finally:
        client.close()


def run_containers(scope: str, run_ids: Iterable[str]) -> dict[str, str]:
    """run id -> container id, for those of ``run_ids`` whose container exists."""
    wanted = set(run_ids)
    return {
        c["Labels"][LABEL_RUN]: c["Id"]
        for c in scope_containers(scope)
        if c.get("Labels", {}).get(LABEL_RUN) in wanted
    }


def _read_stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        out[name] = int(value)
    return out


def container_memory(container_id: str) -> int | None:
    """The container's memory as ``docker stats`` shows it: its cgroup's usage minus its
    inactive file cache (docker CLI's ``calculateMemUsageUnixNoCache``), read from the cgroup
    files (v1 with the cgroupfs driver, or v2 with either driver); None when not found."""
    v1 = CGROUP / "memory" / "docker" / container_id
    if (v1 / "memory.usage_in_bytes").exists():
        usage = int((v1 / "memory.usage_in_bytes").read_text())
        return usage - _read_stat(v1 / "memory.stat").get("total_inactive_file", 0)
    for v2 in (
        CGROUP / "system.slice" / f"docker-{container_id}.scope",
        CGROUP / "docker" / container_id,
    ):
        if (v2 / "memory.current").exists():
            usage = int((v2 / "memory.current").read_text())
            return usage - _read_stat(v2 / "memory.stat").get("inactive_file", 0)
    return None


def container_cpu_seconds(container_id: str) -> float | None:
    """CPU the container's processes have used since it started (its cgroup's cpuacct, v1,
    or ``cpu.stat`` usage_usec, v2); None when not found."""
    v1 = CGROUP / "cpuacct" / "docker" / container_id / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    for v2 in (
        CGROUP / "system.slice" / f"docker-{container_id}.scope",
        CGROUP / "docker" / container_id,
    ):
        if (v2 / "cpu.stat").exists():
            return _read_stat(v2 / "cpu.stat")["usage_usec"] / 1e6
    return None


def pss_bytes(pid: int) -> int:
    """A process's proportional set size (its shared pages divided among their users)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def shims_pss(container_ids: Iterable[str]) -> tuple[int, int]:
    """(PSS summed, shims found) of the containerd shims of these containers (one
    ``containerd-shim-runc-v2 ... -id CONTAINER`` each)."""
    wanted, total, found = set(container_ids), 0, 0
    for pid in _pids():
        argv = _cmdline(pid)
        if not argv or "containerd-shim" not in argv[0] or "-id" not in argv:
            continue
        at = argv.index("-id") + 1
        if at < len(argv) and argv[at] in wanted:
            with contextlib.suppress(OSError):
                total += pss_bytes(pid)
                found += 1
    return total, found


def daemons_pss(pidfile: Path = Path("/var/run/docker.pid")) -> int | None:
    """PSS of the default dockerd (its pidfile) and its containerd child; None if not found
    (another daemon, or none on this machine)."""
    try:
        dockerd = int(pidfile.read_text().strip())
        total = pss_bytes(dockerd)
    except (OSError, ValueError):
        return None
    for pid in _pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == dockerd and Path(_cmdline(pid)[0]).name == "containerd":
                total += pss_bytes(pid)
    return total


def open_files_limit(pid: int) -> int | None:
    """The process's soft RLIMIT_NOFILE, or None when unlimited or unreadable."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return None if soft == "unlimited" else int(soft)
    return None


class PeakSampler:
    """Samples a process's thread count and open file descriptors every ``interval_s`` on a
    thread of its own, keeping the peaks (what would stop many turns at once)."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.threads = self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="density-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                status = Path(f"/proc/{self.pid}/status").read_text()
                threads = next(
                    int(line.split()[1])
                    for line in status.splitlines()
                    if line.startswith("Threads:")
                )
                self.threads = max(self.threads, threads)
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
