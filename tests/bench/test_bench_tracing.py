"""Row 11 (the cost of tracing) keeps working with tiny sizes: the flood and the no-op turns
with tracing on and off, the spans exported only with it on (bench/row11_tracing.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row11_tracing
from bench.context import Bench

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery]


def test_tracing_row_measures_on_and_off_and_exports_only_when_on(tmp_path: Path) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path, flood_repeats=1) as bench:
        result = row11_tracing.run(bench)
    assert result.skipped is None, result.skipped
    assert [f.measure for f in result.figures] == [
        "local: events/s with tracing on vs off",
        "local:   no-op turn submit -> terminal p50, tracing on vs off",
    ]
    for figure in result.figures:
        assert figure.ours is not None and math.isfinite(figure.ours) and figure.ours > 0
        assert figure.baseline is not None and math.isfinite(figure.baseline)
    assert result.checks and all(result.checks.values()), result.checks
