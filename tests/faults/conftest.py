"""Fault injection: private Redis servers we may stop and restart, and leak checks."""

from __future__ import annotations

import os
from pathlib import Path

from bench.private_redis import PrivateRedis  # noqa: F401 -- the fault tests import it here
from tests.integration.conftest import env, workers  # noqa: F401 -- fixtures re-used here


def processes_in(root: Path) -> list[int]:
    """Pids of live processes whose working directory is under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(str(root)):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
