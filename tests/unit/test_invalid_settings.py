"""A setting that is not valid (HARNESS_REDIS_URL=notaurl) is one ``harness:`` line and exit
status 2 on the command line, a failed check in ``doctor``, and a typed error in Python: never
redis-py's bare ValueError."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config import SettingsError, load_settings
from tests.conftest import ROOT
from worker.cli import doctor
from worker.client import HarnessClient
from worker.errors import HarnessError, InvalidSettings

RUN_ID = "r" + "0" * 23 + "1"


def _harness(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["status", RUN_ID],
        ["run", "stdio-json", "hello", "--executable", "x"],
        ["events", RUN_ID],
    ],
    ids=lambda argv: argv[0],
)
def test_cli_says_a_redis_url_that_is_not_one_in_one_line(argv: list[str]) -> None:
    done = _harness(*argv, HARNESS_REDIS_URL="notaurl")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("harness: invalid settings: HARNESS_REDIS_URL: ")
    assert "redis://" in lines[0]


def test_cli_says_another_invalid_setting_in_one_line() -> None:
    done = _harness("status", RUN_ID, HARNESS_STREAM_MAXLEN="many")
    assert done.returncode == 2
    assert done.stderr.startswith("harness: invalid settings: HARNESS_STREAM_MAXLEN")
    assert "Traceback" not in done.stderr


def test_client_raises_a_typed_error_for_a_redis_url_that_is_not_one() -> None:
    with pytest.raises(InvalidSettings, match="HARNESS_REDIS_URL") as caught:
        HarnessClient(load_settings(redis_url="notaurl"))
    assert isinstance(caught.value, HarnessError)
    assert isinstance(caught.value, SettingsError)  # what config's own callers catch
    assert caught.value.exit_code == 2
    with pytest.raises(InvalidSettings, match="HARNESS_REDIS_URL"):
        HarnessClient.from_url("notaurl")


def test_client_built_from_the_environment_raises_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARNESS_REDIS_URL", "notaurl")
    with pytest.raises(InvalidSettings, match="HARNESS_REDIS_URL"):
        HarnessClient()
    monkeypatch.setenv("HARNESS_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("HARNESS_STREAM_MAXLEN", "many")
    with pytest.raises(InvalidSettings, match="HARNESS_STREAM_MAXLEN"):
        HarnessClient()


def test_doctor_fails_its_redis_check_with_the_fix() -> None:
    check = doctor._redis(load_settings(redis_url="notaurl"))
    assert not check.ok
    assert check.detail.startswith("HARNESS_REDIS_URL is not a Redis URL")
    assert "redis://" in check.fix
