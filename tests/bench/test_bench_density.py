"""Row 17 (density: idle runs and turns in flight on one worker) keeps working with tiny counts,
through a real worker and Docker (bench/row17_density.py): every figure is a number, the one
target (Redis bytes per idle run) has its verdict line, every correctness check holds (all
runs idle with their containers, every in-flight turn completed with one terminal, every run
ended, no container left), and the printed table shows them. No time is asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row17_density
from bench.context import Bench
from bench.density_host import scope_containers
from bench.table import render_text

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]


def test_density_row_prints_its_figures_and_verdict(tmp_path: Path, redis_url: str) -> None:
    from tests.integration.docker_fixtures import ensure_images, require_docker

    require_docker()
    ensure_images(["demo"])
    with Bench("smoke", backends=("docker",), tmp=tmp_path) as bench:
        assert bench.backends == ("docker",), bench.docker_skip
        result = row17_density.run(bench)
        left = scope_containers(bench.env.scope)
    assert result.skipped is None, result.skipped
    for figure in result.figures:
        assert figure.ours is not None and math.isfinite(figure.ours), figure
        assert figure.baseline is None or math.isfinite(figure.baseline), figure
    held = [f for f in result.figures if f.met is not None]
    assert [f.measure for f in held] == ["Redis bytes per idle run vs its keys as JSON"]
    sizes = row17_density.SIZES["smoke"]
    assert result.checks == {
        f"all {sizes.idle_runs} runs idle, each with its container running": True,
        f"all {sizes.in_flight} in-flight turns completed with exactly one terminal": True,
        f"all {sizes.idle_runs + 1} runs ended": True,
        "no container of the row left": True,
    }
    assert left == []
    events = next(f for f in result.figures if "events published" in f.measure)
    assert events.ours is not None and events.ours >= sizes.in_flight * sizes.lines
    printed = render_text([result])
    verdict = "met" if held[0].met else "MISSED"
    assert any(held[0].measure in line and line.endswith(verdict) for line in printed.split("\n"))
    assert "worker RSS per idle run" in printed and "worker CPU per published event" in printed


def test_density_row_says_why_it_skips_without_docker(tmp_path: Path, redis_url: str) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path) as bench:
        result = row17_density.run(bench)
    assert result.skipped and not result.figures
