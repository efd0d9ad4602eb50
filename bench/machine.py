"""The machine a run measured: date, CPUs, memory, kernel, Docker, Redis, Python."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import redis


def _mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1024 * 1024)
    return float("nan")


def busy_cpu_seconds() -> float:
    """CPU time every core of the machine has spent busy since boot (/proc/stat: all but idle
    and iowait), whoever spent it."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _docker_version() -> str:
    try:
        out = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    return out.stdout.strip() or "unavailable"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def describe(redis_url: str) -> dict[str, str]:
    try:
        info = redis.Redis.from_url(redis_url, socket_connect_timeout=2).info("server")
        redis_version = str(info.get("redis_version", "?"))
    except redis.RedisError:
        redis_version = "unreachable"
    load = os.getloadavg()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "memory": f"{_mem_total_gib():.1f} GiB",
        "kernel": platform.release(),
        "docker": _docker_version(),
        "redis": redis_version,
        "python": platform.python_version(),
        "load": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min, at the start)",
    }
