"""``harness export -o FILE`` and ``HarnessClient.export`` refuse an output they cannot write
(a missing folder, a folder) before the run's host is asked: one ``harness:`` line, exit
status 2, InvalidInput, and no file, partial or not, left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from config import load_settings
from tests.conftest import ROOT
from worker.client import HarnessClient
from worker.errors import InvalidInput

RUN_ID = "r" + "0" * 23 + "1"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nowhere() -> str:
    """Redis and broker on a closed port: the refusal must come before either is asked."""
    return f"redis://127.0.0.1:{_closed_port()}/0"


def _export(output: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "export", RUN_ID, "-o", str(output)],
        cwd=ROOT,
        env={**os.environ, "HARNESS_REDIS_URL": redis_url, "HARNESS_BROKER_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _unwritable(tmp_path: Path) -> list[tuple[Path, str]]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    return [
        (tmp_path / "missing" / "f.tar.gz", "its folder"),
        (folder, "it is a folder"),
    ]


def test_cli_refuses_an_output_it_cannot_write_in_one_line(tmp_path: Path, nowhere: str) -> None:
    for output, why in _unwritable(tmp_path):
        done = _export(output, nowhere)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"harness: cannot write the export to {str(output)!r}: {why}")
        assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a-folder"]


def test_client_raises_invalid_input_and_leaves_nothing(tmp_path: Path, nowhere: str) -> None:
    client = HarnessClient(load_settings(redis_url=nowhere, broker_url=nowhere))
    try:
        for output, why in _unwritable(tmp_path):
            with pytest.raises(InvalidInput, match=why):
                client.export(RUN_ID, output)
    finally:
        client.close()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a-folder"]
