"""The benchmarks keep working: every row, with tiny sizes, through the same code.

Only what a benchmark produces is checked: each row yields its figures (numbers, not
"n/a") and its correctness checks hold - every event present and in order, every stamped
line seen, every concurrent turn completed, the oversized line counted as a drop and the
big stream published whole. No timing is asserted, ever.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import (
    row1_overhead,
    row2_throughput,
    row3_latency,
    row4_concurrency,
    row5_first_turn,
    row6_big_output,
)
from bench.context import Bench
from bench.table import RowResult, render_text
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def bench(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bench]:
    backend = request.param
    if backend == "docker":
        from tests.integration.docker_fixtures import ensure_images, require_docker

        require_docker()
        ensure_images(["demo"])
    with Bench("smoke", backends=(backend,), tmp=tmp_path_factory.mktemp(f"bench-{backend}")) as b:
        assert b.backends == (backend,), b.docker_skip
        yield b


def _assert_measured(result: RowResult) -> None:
    """Every figure is a number (the warm-pool line excepted) and every check held."""
    assert result.skipped is None, result.skipped
    assert result.figures, "the row produced no figures"
    for figure in result.figures:
        if figure.ours_text is not None:
            continue
        assert figure.ours is not None and math.isfinite(figure.ours), figure
        if figure.baseline is not None:
            assert math.isfinite(figure.baseline), figure
    failed = [name for name, ok in result.checks.items() if not ok]
    assert not failed, f"{failed}\n{render_text([result])}"
    assert render_text([result])


def test_overhead_row_measures_our_turns_and_bare_runs(bench: Bench) -> None:
    result = row1_overhead.run(bench)
    _assert_measured(result)
    assert result.checks


def test_throughput_row_finds_every_event_in_order(bench: Bench) -> None:
    result = row2_throughput.run(bench)
    _assert_measured(result)
    assert any("present, in order" in name for name in result.checks)


def test_latency_row_sees_every_stamped_line_in_order(bench: Bench) -> None:
    result = row3_latency.run(bench)
    _assert_measured(result)
    assert any("in order" in name for name in result.checks)


def test_concurrency_row_completes_every_turn_and_reads_worker_memory(bench: Bench) -> None:
    result = row4_concurrency.run(bench)
    _assert_measured(result)
    assert any("RSS per in-flight turn" in f.measure for f in result.figures)


def test_first_turn_row_compares_with_docker_run_and_a_warm_pool(bench: Bench) -> None:
    result = row5_first_turn.run(bench)
    if bench.backends == ("local",):
        assert result.skipped  # a Docker-only row
        return
    _assert_measured(result)
    warm = next(f for f in result.figures if "warm pool" in f.measure)
    assert warm.ours is not None and warm.baseline is not None
    assert result.checks["every warm first turn claimed a warm container"]


def test_big_output_row_counts_oversized_line_and_publishes_whole_stream(bench: Bench) -> None:
    result = row6_big_output.run(bench)
    _assert_measured(result)
    assert any("counted as oversized" in name for name in result.checks)
    assert any("lines of the stream published" in name for name in result.checks)


def test_command_prints_table_for_one_row(redis_url: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--profile",
            "smoke",
            "--only",
            "1",
            "--sandbox",
            "local",
            "--json",
            str(tmp_path / "bench.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "submit->terminal p50" in out.stdout
    assert "nproc: " in out.stdout
    assert (tmp_path / "bench.json").read_text().startswith("{")


def test_spend_row_measures_the_budget_check_and_the_slot_take(
    redis_url: str, tmp_path: Path
) -> None:
    from bench import row8_spend

    with Bench("smoke", backends=("local",), tmp=tmp_path) as b:
        _assert_measured(row8_spend.run(b))


def test_redis_cost_row_stores_every_event_and_leaves_runs_idle(
    redis_url: str, tmp_path: Path
) -> None:
    from bench import row10_redis

    if shutil.which("redis-server") is None:
        pytest.skip("row 10 starts a redis-server of its own")
    with Bench("smoke", backends=("local",), tmp=tmp_path) as b:
        result = row10_redis.run(b)
    _assert_measured(result)
    assert any("stored" in name for name in result.checks)
    assert any("idle" in name for name in result.checks)


def test_api_row_streams_every_event_to_sse_clients_and_a_raw_reader(
    redis_url: str, tmp_path: Path
) -> None:
    """Row 12 (the HTTP API's event streams) at smoke sizes: a real API process, its SSE
    clients and a raw XREAD client each get every event, in order."""
    from bench import row12_api

    with Bench("smoke", backends=("local",), tmp=tmp_path) as b:
        result = row12_api.run(b)
    _assert_measured(result)
    assert any("in order" in name for name in result.checks)
    shared = next(f for f in result.figures if "per Redis connection" in f.measure)
    assert shared.ours is not None and shared.ours > 1  # streams share the API's connections
