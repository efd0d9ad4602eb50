"""Row 16 (the HTTP path: POST /v1/runs and the run's SSE stream against start_run and XREAD)
keeps working with tiny counts, through a real API process, a real worker and both sandbox
backends (bench/row16_http_path.py): every figure is a number (or an interval of two), each
backend's two overhead lines from their parts carry a verdict, every correctness check holds,
and the printed table shows them. No time is asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row16_http_path
from bench.context import Bench
from bench.table import render_text

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

TARGETED = (
    "overhead to the first event from its parts p50",
    "overhead to the terminal event from its parts p50",
)


def test_http_path_row_prints_its_figures_and_verdicts(tmp_path: Path, redis_url: str) -> None:
    from tests.integration.docker_fixtures import ensure_images, require_docker

    require_docker()
    ensure_images(["demo"])
    with Bench("smoke", backends=("docker", "local"), tmp=tmp_path) as bench:
        assert bench.backends == ("docker", "local"), bench.docker_skip
        result = row16_http_path.run(bench)
    assert result.skipped is None, result.skipped
    for figure in result.figures:
        if figure.ours_text is not None and figure.ours_text.startswith("["):
            low, high = (float(x.strip(" ms")) for x in figure.ours_text[1:-4].split(","))
            assert low <= high, figure
            continue
        assert figure.ours is not None and math.isfinite(figure.ours), figure
        assert figure.baseline is None or math.isfinite(figure.baseline), figure
    intervals = [f.measure for f in result.figures if "bootstrap 95% interval" in f.measure]
    assert len(intervals) == 8, intervals
    held = [f.measure for f in result.figures if f.met is not None]
    assert [(m.split(":")[0], next(t for t in TARGETED if t in m)) for m in held] == [
        (backend, target) for backend in ("docker", "local") for target in TARGETED
    ]
    assert len(result.checks) == 6 and all(result.checks.values()), result.checks
    printed = render_text([result])
    for figure in result.figures:
        if figure.met is not None:
            verdict = "met" if figure.met else "MISSED"
            assert any(
                figure.measure in line and line.endswith(verdict) for line in printed.split("\n")
            )


def test_http_path_row_runs_on_the_local_backend_alone(tmp_path: Path, redis_url: str) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path) as bench:
        result = row16_http_path.run(bench)
    assert result.figures and all(f.measure.startswith("local:") for f in result.figures)
    assert len(result.checks) == 3 and all(result.checks.values()), result.checks
