"""Chaos across two Docker daemons, with no beat process and default host queues.

Workers SIGKILLed and SIGTERMed mid-turn, one daemon's workers all stopped for longer than
the host timeout and started again, and the Redis that is both broker and store restarted,
while 12 runs of 4 completed turns each are driven (bench/chaos.py). The workers' own
reaper passes close what the faults leave; a run outlives every fault with its one
container and its workspace, and ``end`` plus a reaper pass leaves nothing behind.
"""

from __future__ import annotations

import shutil

import pytest

from bench.chaos import chaos
from tests.conftest import require
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(420)
def test_runs_outlive_worker_host_and_redis_faults_on_two_daemons() -> None:
    require_docker()
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    ensure_images(["demo"])
    report = chaos(runs=12, turns=4, seed=3)
    print("\n" + "\n".join(report.lines))  # the figures, with pytest -s
    assert report.problems == []
    assert report.runs == 12
    assert report.completed == 48
    # Every kind of fault happened.
    assert {"worker-kill", "worker-term", "host-away", "redis-restart"} <= set(report.faults)
    # Faults ended turns only in the ways a producer retries.
    assert set(report.outcomes) <= {"turn-complete", "worker-lost", "shutdown", "sandbox"}
    assert report.left == {"containers": 0, "workspaces": 0, "credentials": 0}
    assert report.seconds < 240
