"""A small soak: random faults over several workers leave nothing behind and lose nothing."""

from __future__ import annotations

import pytest

from bench.soak import WEIGHTS, soak
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_soak_with_random_faults_is_clean(redis_url: str) -> None:
    require_docker()
    ensure_images(["demo"])
    # Every kind of fault, worker kills and warm shutdowns included: a turn held by a killed
    # worker is closed by the workers' own reaper passes, and one the broker lost is sent
    # again (HARNESS_RESEND_AFTER_S), so none waits longer than the soak does.
    report = soak(turns=24, workers=2, parallel=4, seed=5, broker=redis_url)
    assert report["problems"] == []
    assert report["turns"] == 24
    assert report["leaked"] == 0
    assert report["live"] == 0
    assert sum(n for kind, n in report["faults"].items() if kind != "none") > 0
    assert set(report["faults"]) & {"worker-kill", "worker-term"}, WEIGHTS
