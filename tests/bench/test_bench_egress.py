"""Row 9 (the egress gateway) keeps working with tiny sizes: a streamed request through the
gateway and direct, and the gateway's memory with concurrent streams (bench/row9_egress.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row9_egress
from bench.context import Bench

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.docker]


def test_egress_row_measures_both_paths_and_the_gateways_memory(
    tmp_path: Path, redis_url: str
) -> None:
    from tests.integration.docker_fixtures import ensure_images, require_docker

    require_docker()
    ensure_images(["demo", "gateway"])
    with Bench("smoke", backends=("docker",), tmp=tmp_path) as bench:
        result = row9_egress.run(bench)
    assert result.skipped is None, result.skipped
    measures = [f.measure for f in result.figures]
    assert any(m.startswith("streamed request p50") for m in measures), measures
    for figure in result.figures:
        assert figure.ours is not None and math.isfinite(figure.ours) and figure.ours > 0
        assert figure.baseline is not None and figure.baseline > 0
    assert all(result.checks.values()), result.checks
