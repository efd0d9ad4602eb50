"""Row 13 keeps working: its figures are numbers and its checks hold (no timing asserted)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import row13_tools
from bench.context import Bench

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_row13_measures_both_round_trips_and_checks_every_answer(
    redis_url: str, tmp_path: Path
) -> None:
    with Bench("smoke", backends=("local",), tmp=tmp_path) as bench:
        result = row13_tools.run(bench)
    assert result.checks and all(result.checks.values()), result.checks
    assert len(result.figures) == 2
    for figure in result.figures:
        assert figure.ours is not None and figure.baseline is not None
        assert not math.isnan(figure.ours) and not math.isnan(figure.baseline)
