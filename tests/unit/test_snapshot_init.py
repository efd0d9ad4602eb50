"""A new snapshot store is a copy of the template store: a valid, hardened bare repository,
made once however many threads ask at the same moment, and the first snapshot of an empty
workspace needs no git process."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from sandbox.base import SnapshotError
from sandbox.store import git_objects
from sandbox.store.git_objects import EMPTY_TREE
from sandbox.store.snapshots import TEMPLATE, SnapshotStore


def _git(store: SnapshotStore, *args: str) -> str:
    out = subprocess.run(
        ["git", "--git-dir", str(store.path), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_a_new_store_is_a_hardened_repository_copied_from_the_template(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "r1")
    store.init()

    assert (tmp_path / "snapshots" / TEMPLATE / "HEAD").is_file()
    assert _git(store, "config", "gc.auto") == "0"
    assert _git(store, "config", "core.logAllRefUpdates") == "false"
    assert _git(store, "rev-parse", "--is-bare-repository") == "true"
    assert not (store.path / "hooks").exists()
    assert (store.path / "info" / "attributes").read_text()
    assert [p.name for p in store.path.parent.iterdir() if p.name.startswith(".r1")] == []


def test_the_first_snapshot_of_an_empty_workspace_starts_no_git_process(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".home").mkdir(parents=True)
    store = SnapshotStore(tmp_path, "r2")
    store.init()
    started: list[object] = []
    original = git_objects.FastImport.__init__

    def counted(self: git_objects.FastImport, *args: object, **kwargs: object) -> None:
        started.append(args)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    git_objects.FastImport.__init__ = counted  # type: ignore[method-assign]
    try:
        summary = store.take(workspace, 0, "the workspace before the first turn")
    finally:
        git_objects.FastImport.__init__ = original  # type: ignore[method-assign]

    assert started == []
    assert _git(store, "rev-parse", f"{summary.snapshot}^{{tree}}") == EMPTY_TREE
    subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--strict"], check=True)
    (workspace / "a.txt").write_text("one\n")
    assert store.take(workspace, 1, "turn 1").added == ("a.txt",)
    assert _git(store, "log", "--format=%s", "refs/turns/1").splitlines() == [
        "turn 1",
        "the workspace before the first turn",
    ]


def test_threads_that_create_one_store_at_once_leave_one_valid_repository(tmp_path: Path) -> None:
    stores = [SnapshotStore(tmp_path, "r3") for _ in range(8)]
    gate = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def create(store: SnapshotStore) -> None:
        gate.wait()
        try:
            store.init()
        except BaseException as exc:  # noqa: BLE001 -- asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert stores[0].exists()
    leftovers = [p.name for p in (tmp_path / "snapshots").iterdir() if p.name.startswith(".")]
    assert sorted(leftovers) == sorted({".git-home", TEMPLATE} & set(leftovers))
    subprocess.run(["git", "--git-dir", str(stores[0].path), "fsck", "--strict"], check=True)


def test_a_half_made_store_is_made_whole(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "r4")
    store.path.mkdir(parents=True)
    (store.path / "objects").mkdir()  # what an interrupted creation may leave

    store.init()

    assert store.exists()
    assert _git(store, "config", "gc.auto") == "0"


def test_with_the_watch_off_every_snapshot_walks_the_whole_tree(tmp_path: Path) -> None:
    """``HARNESS_SNAPSHOT_WATCH=false``: no directory is watched, and a change whose event
    never came (here: drained and dropped, as a daemon in a VM would never send it) is
    still recorded. With the watch on, the same change waits for the next full walk."""
    from sandbox.store import watch
    from sandbox.store.snapshots import SnapshotLimits

    def missed_change(limits: SnapshotLimits, run_id: str) -> tuple[str, ...]:
        workspace = tmp_path / run_id
        (workspace / "src").mkdir(parents=True)
        (workspace / "src" / "a.py").write_text("one\n")
        time.sleep(0.1)  # out of the racy window: the entry is trusted
        store = SnapshotStore(tmp_path, run_id, limits)
        store.take(workspace, 0, "turn 0")
        store.take(workspace, 1, "turn 1")
        (workspace / "src" / "a.py").write_text("two\n")
        time.sleep(0.1)
        held = watch.watch_of(os.path.abspath(store.path))
        held.drain()  # the event is dropped
        if not limits.watch:
            assert held._wds == {}  # no kernel watch was ever added
        return store.take(workspace, 2, "turn 2").modified

    assert missed_change(SnapshotLimits(watch=False), "off") == ("src/a.py",)
    assert missed_change(SnapshotLimits(watch=True), "on") == ()


def test_an_unseeded_runs_baseline_is_the_empty_tree_recorded_without_its_workspace(
    tmp_path: Path,
) -> None:
    """take_empty: no workspace looked at (it need not exist yet); the next snapshot walks
    what the turn made, and the run can go back to the empty baseline."""
    store = SnapshotStore(tmp_path, "r3")
    baseline = store.take_empty(0, "the workspace before the first turn")
    assert _git(store, "rev-parse", f"{baseline.snapshot}^{{tree}}") == EMPTY_TREE
    assert (baseline.turn, baseline.added, baseline.complete) == (0, (), True)
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "a.py").write_text("print(1)\n")
    first = store.take(workspace, 1, "turn 1")
    assert first.added == ("src/a.py",)
    assert _git(store, "rev-parse", f"{first.snapshot}^") == baseline.snapshot
    store.restore(workspace, 0, os.getuid(), os.getgid(), as_turn=2)
    assert not (workspace / "src" / "a.py").exists()
    subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--strict"], check=True)


def test_an_empty_baseline_is_refused_on_a_store_with_snapshots(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    store = SnapshotStore(tmp_path, "r4")
    store.take(workspace, 0, "before")
    try:
        store.take_empty(0, "again")
    except SnapshotError as exc:
        assert "has snapshots" in str(exc)
    else:
        raise AssertionError("take_empty wrote over a store's snapshots")
