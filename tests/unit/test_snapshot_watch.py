"""The watched snapshot (a rescan of the directories inotify saw change) against a full walk of
the same workspace: every summary and tree must be the same, whichever path was taken."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.store import scan, watch
from sandbox.store.git_objects import FastImport, write_commit
from sandbox.store.snapshots import SnapshotLimits, SnapshotStore, SnapshotSummary
from tests.unit.sandbox_snapshots.git_fixtures import git, write_tree

ROOT_OF_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def ws(root: Path) -> Path:
    workspace = root / "run" / "r1"
    (workspace / ".home").mkdir(parents=True)
    write_tree(
        workspace,
        {
            "a/one.txt": "one\n",
            "a/two.txt": "two\n",
            "a/b/deep.txt": "deep\n",
            "c/three.txt": "three\n",
            "top.txt": "top\n",
        },
    )
    return workspace


class Checked:
    """A store whose every take is compared with a full walk of a copy of the store."""

    def __init__(self, root: Path, ws: Path, tmp: Path, **limits: object) -> None:
        self.limits = SnapshotLimits(**limits)  # type: ignore[arg-type]
        self.store = SnapshotStore(root, "r1", self.limits)
        self.ws = ws
        self.tmp = tmp
        self.turn = 0
        self.store.take(ws, 0, "baseline")
        time.sleep(scan.RACY_NS / 1e9 * 1.2)  # out of the racy window: trusted after this
        self.take(rescanned=None)

    @property
    def watch(self) -> watch.Watch:
        return watch.watch_of(os.path.abspath(self.store.path))

    def take(self, *, rescanned: bool | None = True) -> SnapshotSummary:
        """Take the next turn; ``rescanned``: True if it must have been a rescan, False a
        full walk, None either."""
        self.turn += 1
        reference = self._reference()
        expected = reference.take(self.ws, self.turn, "t")
        got = self.store.take(self.ws, self.turn, "t")
        fields = [f.name for f in dataclasses.fields(SnapshotSummary) if f.name != "snapshot"]
        assert {f: getattr(got, f) for f in fields} == {f: getattr(expected, f) for f in fields}
        assert _tree(self.store, got.snapshot) == _tree(reference, expected.snapshot)
        if rescanned is not None:
            assert (self.watch.since_full > 0) is rescanned
        return got

    def _reference(self) -> SnapshotStore:
        copy = self.tmp / f"reference{self.turn}"
        shutil.copytree(self.store.path, copy / "snapshots" / "r1")
        reference = SnapshotStore(copy, "r1", self.limits)
        # A watch of its own, never registered: it adds no inotify watch (the workspace's
        # directories are the checked store's), so every take of it is a full walk.
        alone = watch.Watch("unregistered")
        reference._watch = lambda: alone  # type: ignore[method-assign]
        return reference


def _tree(store: SnapshotStore, commit: str) -> str:
    return git(store.path, "rev-parse", f"{commit}^{{tree}}").strip()


@pytest.fixture
def checked(root: Path, ws: Path, tmp_path: Path) -> Checked:
    return Checked(root, ws, tmp_path)


def test_unchanged_workspace_is_rescanned_as_nothing(checked: Checked) -> None:
    summary = checked.take()
    assert (summary.added, summary.modified, summary.deleted) == ((), (), ())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda ws: (ws / "a/one.txt").write_text("changed\n"), id="modified"),
        pytest.param(lambda ws: (ws / "a/b/new.txt").write_text("new\n"), id="created"),
        pytest.param(lambda ws: (ws / "c/three.txt").unlink(), id="deleted"),
        pytest.param(lambda ws: (ws / "a/one.txt").rename(ws / "a/uno.txt"), id="renamed"),
        pytest.param(
            lambda ws: (ws / "a/one.txt").rename(ws / "c/one.txt"), id="renamed-across-dirs"
        ),
        pytest.param(lambda ws: (ws / "top.txt").chmod(0o755), id="chmod-x"),
        pytest.param(
            lambda ws: ((ws / "a/two.txt").unlink(), (ws / "a/two.txt").symlink_to("/etc/passwd")),
            id="file-to-symlink",
        ),
        pytest.param(lambda ws: os.mkfifo(ws / "c/pipe"), id="fifo-skipped"),
        pytest.param(lambda ws: (ws / "a/b/deep.txt").write_text("x" * 5000), id="large"),
    ],
)
def test_a_file_change_is_rescanned_like_a_full_walk(
    root: Path, ws: Path, tmp_path: Path, change: Callable[[Path], object]
) -> None:
    checked = Checked(root, ws, tmp_path, max_file_bytes=4096)
    change(ws)
    checked.take()
    checked.take()  # and the racy rescan after it
    time.sleep(scan.RACY_NS / 1e9 * 1.2)
    checked.take()


def test_a_fifo_removed_leaves_the_skipped_list(checked: Checked) -> None:
    os.mkfifo(checked.ws / "c/pipe")
    assert checked.take().skipped == ("c/pipe",)
    (checked.ws / "c/pipe").unlink()
    assert checked.take().skipped == ()


def _dir_to_link(directory: Path, target: Path) -> None:
    shutil.rmtree(directory)
    directory.symlink_to(target)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda ws: (ws / "c/new").mkdir(), id="dir-created"),
        pytest.param(lambda ws: shutil.rmtree(ws / "a/b"), id="dir-deleted"),
        pytest.param(lambda ws: (ws / "a").rename(ws / "z"), id="dir-renamed"),
        pytest.param(lambda ws: (ws / "a/b").chmod(0o700), id="dir-chmod"),
        pytest.param(lambda ws: _dir_to_link(ws / "c", ws.parent.parent), id="dir-to-link-outside"),
    ],
)
def test_a_directory_change_falls_back_to_the_full_walk(
    checked: Checked, change: Callable[[Path], object]
) -> None:
    change(checked.ws)
    checked.take(rescanned=False)
    (checked.ws / "top.txt").write_text("after\n")
    checked.take(rescanned=True)


def test_an_ignored_directory_created_keeps_the_watch(checked: Checked) -> None:
    (checked.ws / "a/.git").mkdir()
    (checked.ws / "a/.git/config").write_text("[core]\n")
    (checked.ws / ".home/more").mkdir()
    checked.take(rescanned=True)


def test_a_rewrite_in_the_racy_window_with_the_same_size_and_mtime_is_seen(
    checked: Checked,
) -> None:
    path = checked.ws / "a/one.txt"
    path.write_text("1111\n")
    checked.take()
    before = path.stat()
    path.write_text("2222\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    checked.take()


def test_a_change_made_while_the_snapshot_runs_is_in_the_next_one(
    checked: Checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    (checked.ws / "a/one.txt").write_text("dirty\n")
    real = scan.Scanner._walk
    done: list[bool] = []

    def walk_and_write(self: scan.Scanner, fd: int, prefix: str) -> None:
        real(self, fd, prefix)
        if not done:
            done.append(True)
            (checked.ws / "c/three.txt").write_text("written meanwhile\n")
            (checked.ws / "a/one.txt").write_text("again meanwhile\n")

    monkeypatch.setattr(scan.Scanner, "_walk", walk_and_write)
    checked.store.take(checked.ws, 50, "during")  # whatever it saw
    monkeypatch.setattr(scan.Scanner, "_walk", real)
    checked.turn = 50
    summary = checked.take()
    assert "c/three.txt" in summary.modified or "a/one.txt" in summary.modified


def test_a_queue_overflow_falls_back_to_the_full_walk(checked: Checked) -> None:
    files = [checked.ws / "a/one.txt", checked.ws / "a/two.txt"]
    # The reader thread waits on this lock, so the kernel's queue (16,384 events by default)
    # overflows for real.
    with watch._hub().lock:
        for i in range(20_000):
            os.utime(files[i % 2])
        (checked.ws / "c/three.txt").write_text("lost in the overflow\n")
    summary = checked.take(rescanned=False)
    assert summary.modified == ("c/three.txt",)
    checked.take(rescanned=None)


def test_a_tip_taken_by_another_process_is_not_trusted(checked: Checked) -> None:
    (checked.ws / "a/one.txt").write_text("seen by the other process\n")
    code = (
        "import sys; from pathlib import Path; from sandbox.store.snapshots import SnapshotStore;"
        "SnapshotStore(Path(sys.argv[1]), 'r1').take(Path(sys.argv[2]), 99, 'other')"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(checked.store.root), str(checked.ws)],
        check=True, cwd=ROOT_OF_REPO,
    )  # fmt: skip
    (checked.ws / "c/three.txt").write_text("after the other process\n")
    checked.turn = 99
    summary = checked.take(rescanned=False)
    assert summary.modified == ("c/three.txt",)


def test_a_lost_watch_falls_back_to_the_full_walk(checked: Checked) -> None:
    checked.watch._broken = "simulated"
    (checked.ws / "top.txt").write_text("changed\n")
    checked.take(rescanned=False)


def test_the_max_files_bound_reached_by_a_rescan_is_a_full_walks_result(
    root: Path, ws: Path, tmp_path: Path
) -> None:
    checked = Checked(root, ws, tmp_path, max_files=5)
    (ws / "a/extra.txt").write_text("one more\n")
    summary = checked.take(rescanned=False)
    assert not summary.complete


def test_every_nth_snapshot_walks_the_whole_tree(checked: Checked) -> None:
    for _ in range(watch.FULL_WALK_EVERY - checked.watch.since_full):
        checked.take(rescanned=True)
    checked.take(rescanned=False)


def test_unchanged_snapshots_written_without_git_keep_a_valid_repository(
    checked: Checked,
) -> None:
    for _ in range(3):
        checked.take()
    (checked.ws / "top.txt").write_text("changed\n")
    checked.take()
    git(checked.store.path, "fsck", "--strict", "--no-dangling")
    log = git(checked.store.path, "log", "--format=%s", "refs/harness/tip").split()
    assert log == ["t"] * checked.turn + ["baseline"]
    turns = checked.store.turns()
    assert turns == list(range(checked.turn + 1))
    tip = git(checked.store.path, "rev-parse", "refs/harness/tip").strip()
    assert checked.store.commit_of(checked.turn) == tip


def test_remove_drops_the_stores_watches(checked: Checked) -> None:
    hub = watch._hub()
    key = os.path.abspath(checked.store.path)
    assert any(owner[0].key == key for owner in hub.owners.values())
    checked.store.remove()
    assert not any(owner[0].key == key for owner in hub.owners.values())
    assert key not in hub.watches


def test_more_stores_than_remembered_degrade_to_full_walks(tmp_path: Path) -> None:
    hub = watch._hub()
    stores = []
    for i in range(watch.MAX_STORES + 6):
        workspace = tmp_path / "run" / f"r{i}"
        write_tree(workspace, {"d/f.txt": f"{i}\n"})
        store = SnapshotStore(tmp_path, f"r{i}")
        store.take(workspace, 0, "baseline")
        stores.append((store, workspace))
    assert len(hub.watches) <= watch.MAX_STORES
    first, workspace = stores[0]
    (workspace / "d/f.txt").write_text("changed\n")
    assert first.take(workspace, 1, "t").modified == ("d/f.txt",)
    for store, _ in stores:
        store.remove()
    keys = {os.path.abspath(store.path) for store, _ in stores}
    assert not any(owner[0].key in keys for owner in hub.owners.values())


def test_a_commit_written_without_git_is_the_one_fast_import_writes(checked: Checked) -> None:
    store = checked.store
    tip = git(store.path, "rev-parse", "refs/harness/tip").strip()
    tree = _tree(store, tip)
    importer = FastImport(store.path, store._home())
    by_git = importer.commit("refs/x", "same\nmessage", tip, [], [], 1_700_000_000)
    assert importer.tree == tree
    assert write_commit(store.path, tree, tip, "same\nmessage", 1_700_000_000) == by_git


def test_a_broken_watch_stops_watching_until_the_next_full_walk(checked: Checked) -> None:
    hub = watch._hub()
    key = checked.watch.key
    (checked.ws / "c/new").mkdir()
    checked.watch.drain()
    assert not any(owner[0].key == key for owner in hub.owners.values())
    checked.take(rescanned=False)
    assert any(owner[0].key == key for owner in hub.owners.values())


def test_a_forked_child_starts_its_own_watch(checked: Checked) -> None:
    (checked.ws / "top.txt").write_text("changed in the child\n")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            summary = checked.store.take(checked.ws, 77, "child")
            fresh = bool(watch._hub().owners)  # its own instance, watched by its own walk
            code = 0 if summary.modified == ("top.txt",) and fresh else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_write_through_another_link_of_a_file_is_seen(checked: Checked) -> None:
    os.link(checked.ws / "c/three.txt", checked.ws / "a/linked.txt")
    checked.take(rescanned=False)  # a new file with two links: where is the other name?
    time.sleep(scan.RACY_NS / 1e9 * 1.2)
    checked.take()
    with open(checked.ws / "a/linked.txt", "a") as f:  # no event in c/
        f.write("through the other name\n")
    summary = checked.take()
    assert summary.modified == ("a/linked.txt", "c/three.txt")


def test_a_write_through_a_link_under_an_ignored_path_waits_for_the_full_walk(
    checked: Checked,
) -> None:
    # No event reaches a watched directory: the documented limit, like a write through mmap.
    os.link(checked.ws / "top.txt", checked.ws / ".home/top-link")
    with open(checked.ws / ".home/top-link", "a") as f:
        f.write("through the ignored name\n")
    assert checked.store.take(checked.ws, 40, "missed").modified == ()
    checked.watch.since_full = watch.FULL_WALK_EVERY
    checked.turn = 40
    assert checked.take(rescanned=False).modified == ("top.txt",)


def test_release_drops_the_watch_and_keeps_the_store(checked: Checked) -> None:
    hub = watch._hub()
    key = checked.watch.key
    checked.store.release()
    assert key not in hub.watches
    assert not any(owner[0].key == key for owner in hub.owners.values())
    assert checked.store.turns() == list(range(checked.turn + 1))
    (checked.ws / "top.txt").write_text("after release\n")
    checked.take(rescanned=False)
