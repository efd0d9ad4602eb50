"""The warm pool's claim of a run's workspace: what a first turn left there before it."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from sandbox.base import RunSpec
from sandbox.docker.warm_pool import ContainerPool, _clear_unused

RUN = "r" + "c" * 24


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the pool must not be asked")


def test_an_empty_home_left_by_the_baseline_snapshot_does_not_block_a_claim(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "run" / RUN
    (workspace / ".home").mkdir(parents=True)
    assert _clear_unused(workspace) is True
    assert list(workspace.iterdir()) == []  # an empty directory: the claim's rename replaces it


def test_a_missing_workspace_can_be_claimed(tmp_path: Path) -> None:
    assert _clear_unused(tmp_path / "run" / RUN) is True


def test_a_seeded_workspace_keeps_its_files_and_takes_no_warm_container(tmp_path: Path) -> None:
    workspace = tmp_path / "run" / RUN
    (workspace / ".home").mkdir(parents=True)
    (workspace / "README").write_text("seeded")
    pool = ContainerPool(
        1,
        tmp_path,
        "scope",
        _unreachable,
        lambda *a, **k: nullcontext(),
        api=None,
        create=_unreachable,
        remove=_unreachable,
    )
    assert pool.claim(RunSpec(run_id=RUN, image="img", network="none")) is None
    assert (workspace / "README").read_text() == "seeded"
    assert (workspace / ".home").is_dir()


def test_a_home_with_files_is_kept(tmp_path: Path) -> None:
    workspace = tmp_path / "run" / RUN
    (workspace / ".home").mkdir(parents=True)
    (workspace / ".home" / ".config").write_text("x")
    assert _clear_unused(workspace) is False
    assert (workspace / ".home" / ".config").exists()
