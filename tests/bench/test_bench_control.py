"""Row 15 (steer, fork, attempts) keeps working with tiny counts, through a real worker and
Docker (bench/row15_control.py): every figure is a number, each target has its verdict line,
every correctness check holds, and the printed table shows them. No time is asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row15_control
from bench.context import Bench
from bench.table import render_text

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

TARGETS = ("steer: call -> harness reads the line p50", "fork, ", "attempts of a no-op turn")


def test_control_row_prints_its_figures_and_verdicts(tmp_path: Path, redis_url: str) -> None:
    from tests.integration.docker_fixtures import ensure_images, require_docker

    require_docker()
    ensure_images(["demo"])
    with Bench("smoke", backends=("docker",), tmp=tmp_path) as bench:
        assert bench.backends == ("docker",), bench.docker_skip
        result = row15_control.run(bench)
    assert result.skipped is None, result.skipped
    for figure in result.figures:
        assert figure.ours is not None and math.isfinite(figure.ours), figure
        assert figure.baseline is None or math.isfinite(figure.baseline), figure
    held = [f for f in result.figures if f.met is not None]
    assert [next(t for t in TARGETS if t in f.measure) for f in held] == list(TARGETS)
    assert len(result.checks) == 5 and all(result.checks.values()), result.checks
    printed = render_text([result])
    for figure in held:
        verdict = "met" if figure.met else "MISSED"
        assert any(
            figure.measure in line and line.endswith(verdict) for line in printed.split("\n")
        )
    assert "load average" in printed


def test_control_row_says_why_it_skips_without_docker(tmp_path: Path, redis_url: str) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path) as bench:
        result = row15_control.run(bench)
    assert result.skipped and not result.figures
