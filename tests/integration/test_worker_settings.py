"""A worker whose settings are not valid does not start (it would say ready and fail every
turn): one line saying which setting, and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.celery]


def test_a_worker_with_an_invalid_redis_url_does_not_start() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")},
        "HARNESS_REDIS_URL": "notaurl",
        "HARNESS_BROKER_URL": "memory://",
        "HARNESS_SANDBOX": "local",
        "HARNESS_METRICS_PORT": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "--pool", "threads"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "HARNESS_REDIS_URL" in said
    assert "ready" not in said.lower().split("harness_redis_url")[0][-200:]
