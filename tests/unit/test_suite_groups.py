"""The suite's second phase runs files in parallel (scripts/test: ``-n 2 --dist loadgroup``):
every file that drives the machine's one second Docker daemon must be in its shared group."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT, SECOND_DOCKERD, SHARED_GROUPS

USES_SECOND_DOCKERD = ("second-dockerd", "bench.chaos", "bench.scale_load")
"""What a test file names when it starts, stops or loads the second daemon: the script, or
the bench drivers whose clusters span two daemons."""


def test_every_file_that_drives_the_second_daemon_is_in_its_group() -> None:
    found = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if "tests/unit" not in path.as_posix()
        and any(name in path.read_text() for name in USES_SECOND_DOCKERD)
    }
    assert found, "no test file drives the second daemon: the check has nothing to check"
    grouped = {name for name, group in SHARED_GROUPS.items() if group == SECOND_DOCKERD}
    assert found <= grouped, f"in no group: {sorted(found - grouped)}"


def test_the_grouped_files_exist() -> None:
    missing = [name for name in SHARED_GROUPS if not (ROOT / name).is_file()]
    assert missing == []


def test_the_second_phase_spreads_by_group() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    assert "--dist loadgroup" in script


def test_each_files_tests_run_on_one_worker_under_loadgroup() -> None:
    files = ("tests/unit/test_doctor.py", "tests/unit/test_egress.py")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v"),
            *("-n", "2", "--dist", "loadgroup", *files),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d+)\].*? PASSED (\S+?\.py)::(.+?)\s*$", done.stdout, re.MULTILINE)
    assert ran, done.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, path, test in ran:
        assert test.endswith(f"@{path}"), test  # the group the scheduler keeps together
        workers.setdefault(path, set()).add(worker)
    assert sorted(workers) == sorted(files)
    assert all(len(on) == 1 for on in workers.values()), workers
