"""Percentiles and units, without numpy."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def p50(values: Sequence[float]) -> float:
    return percentile(values, 50)


def mib(size_bytes: float) -> float:
    return size_bytes / (1024 * 1024)


def bootstrap_interval(
    statistic: Callable[[Sequence[int]], float],
    n: int,
    *,
    rounds: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``statistic`` over ``n`` samples: it is called
    with ``rounds`` resamplings of the indices ``0..n-1`` (drawn with replacement; a pair of
    measurements taken together shares its index, so pairs are resampled whole). Seeded: the
    same figures give the same interval."""
    if n == 0:
        return math.nan, math.nan
    draw = random.Random(seed)
    values = [statistic(draw.choices(range(n), k=n)) for _ in range(rounds)]
    tail = (1 - confidence) / 2 * 100
    return percentile(values, tail), percentile(values, 100 - tail)
