"""A small soak: random faults over several workers leave nothing behind and lose nothing."""

from __future__ import annotations

import pytest

from bench.soak import soak
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_soak_with_random_faults_is_clean(redis_url: str) -> None:
    require_docker()
    ensure_images(["demo"])
    # Worker kills and warm shutdowns are proven one by one in test_worker_faults.py; mixed
    # at random they belong to the full soak (python -m bench.soak), where a message held by
    # a killed worker is sometimes returned by kombu later than the soak waits (see the
    # closing note of issue 6).
    kinds = frozenset({"cancel", "exit", "error", "timeout", "redis-restart"})
    report = soak(turns=24, workers=2, parallel=4, seed=5, broker=redis_url, kinds=kinds)
    assert report["problems"] == []
    assert report["turns"] == 24
    assert report["leaked"] == 0
    assert report["live"] == 0
    assert sum(n for kind, n in report["faults"].items() if kind != "none") > 0
