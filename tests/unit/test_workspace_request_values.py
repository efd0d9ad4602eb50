"""``harness rewind``, ``diff`` and ``export`` refuse a turn below 0 before anything is asked:
one ``harness:`` line and exit status 2 on the command line, InvalidInput in Python (they
once waited two minutes for the run's host, which dropped the request)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from tests.conftest import ROOT
from worker.client import HarnessClient
from worker.errors import InvalidInput

RUN_ID = "r" + "0" * 23 + "1"
REFUSAL = "a snapshot is named by its turn, 0 or more"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nowhere() -> str:
    """Redis and broker on a closed port: the refusal must come before either is asked."""
    return f"redis://127.0.0.1:{_closed_port()}/0"


@pytest.mark.parametrize(
    "argv",
    [
        ["rewind", RUN_ID, "-1"],
        ["diff", RUN_ID, "--turn", "-1"],
        ["export", RUN_ID, "-o", "{tmp}/w.tar.gz", "--turn", "-1"],
        ["diff", RUN_ID, "--from", "-3", "--to", "1"],
        ["diff", RUN_ID, "--from", "1", "--to", "-2"],
    ],
    ids=lambda argv: " ".join(argv[:1] + argv[2:]),
)
def test_cli_refuses_a_turn_below_zero_at_once(
    argv: list[str], nowhere: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *(a.format(tmp=tmp_path) for a in argv)],
        cwd=ROOT,
        env={**os.environ, "HARNESS_REDIS_URL": nowhere, "HARNESS_BROKER_URL": nowhere},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("harness: no snapshot after turn -"), lines[0]
    assert REFUSAL in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        ("rewind", {"turn": -1}),
        ("rewind", {"turn": None}),
        ("rewind", {"turn": "1"}),
        ("diff", {"turn": -1}),
        ("diff", {"from_turn": -3, "to_turn": 1}),
        ("diff", {"to_turn": -1}),
        ("diff", {"turn": True}),
        ("export", {"turn": -1}),
    ],
)
def test_client_raises_invalid_input_for_a_turn_that_names_no_snapshot(
    call: str, kwargs: dict[str, Any], nowhere: str, tmp_path: Path
) -> None:
    client = HarnessClient(load_settings(redis_url=nowhere, broker_url=nowhere))
    if call == "export":
        kwargs = {"path": tmp_path / "w.tar.gz", **kwargs}
    try:
        with pytest.raises(InvalidInput, match=REFUSAL):
            getattr(client, call)(RUN_ID, **kwargs)
    finally:
        client.close()
    assert list(tmp_path.iterdir()) == []
