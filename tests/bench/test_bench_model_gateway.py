"""Row 14 (the model gateway) keeps working with tiny sizes: a request and streams through a
route against the same upstream directly, the gateway's memory on a big stream, runs
streaming at once, and from containers through the relay (bench/row14_model_gateway.py).
Figures are checked to be numbers, never against a time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row14_model_gateway
from bench.context import Bench
from bench.table import Figure

pytestmark = [pytest.mark.slow, pytest.mark.redis]

TARGETS = ("added p50", "added p99", "first byte p50", "tokens/s", "RSS growth (peak", "wall")


def assert_numbers(figures: list[Figure]) -> None:
    for figure in figures:
        assert figure.ours is not None and math.isfinite(figure.ours), figure
        assert figure.baseline is None or math.isfinite(figure.baseline), figure
        if "added" in figure.measure:
            continue  # a difference of two timings: finite, its sign the machine's
        if figure.unit == "MiB":  # a process may well not grow at all
            assert figure.ours >= 0 and (figure.baseline or 0) >= 0, figure
        else:
            assert figure.ours > 0 and (figure.baseline is None or figure.baseline > 0), figure


def test_model_gateway_row_on_loopback(tmp_path: Path, redis_url: str) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path) as bench:
        result = row14_model_gateway.run(bench)
    assert result.skipped is None, result.skipped
    assert_numbers(result.figures)
    held = [f for f in result.figures if f.met is not None]
    assert [next(t for t in TARGETS if t in f.measure) for f in held] == list(TARGETS)
    assert not any(f.measure.startswith("container") for f in result.figures)
    assert len(result.checks) == 6 and all(result.checks.values()), result.checks


@pytest.mark.docker
def test_model_gateway_row_through_the_relay_in_a_container(tmp_path: Path, redis_url: str) -> None:
    from tests.integration.docker_fixtures import ensure_images, require_docker

    require_docker()
    ensure_images(["demo"])
    with Bench("smoke", backends=("docker",), tmp=tmp_path) as bench:
        result = row14_model_gateway.run(bench)
    assert_numbers(result.figures)
    containers = [f for f in result.figures if f.measure.startswith("container")]
    assert len(containers) == 2, [f.measure for f in result.figures]
    assert len(result.checks) == 8 and all(result.checks.values()), result.checks
