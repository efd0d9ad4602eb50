"""The snapshot store against real git and real files: take, diff, export, rewind, push."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandbox.store.snapshots import (
    ExportTooLarge,
    SnapshotLimits,
    SnapshotStore,
    UnknownSnapshot,
)
from tests.unit.sandbox_snapshots.git_fixtures import GID, UID, git, git_daemon, write_tree


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def ws(root: Path) -> Path:
    workspace = root / "run" / "r1"
    (workspace / ".home").mkdir(parents=True)
    (workspace / ".home" / "session.json").write_text("vendor session")
    return workspace


def store_for(root: Path, **limits: object) -> SnapshotStore:
    return SnapshotStore(root, "r1", SnapshotLimits(**limits))  # type: ignore[arg-type]


def tar_members(store: SnapshotStore, turn: int) -> dict[str, tarfile.TarInfo]:
    buf = io.BytesIO()
    store.export(turn, buf, 10**9)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        return {m.name: m for m in tar.getmembers()}


def tar_text(store: SnapshotStore, turn: int, name: str) -> str:
    buf = io.BytesIO()
    store.export(turn, buf, 10**9)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read().decode()


def test_take_records_files_and_links_skips_fifo_and_ignores_home_and_git(
    root: Path, ws: Path
) -> None:
    write_tree(ws, {"a.txt": "one\n", "src/main.py": "print(1)\n", ".git/config": "[core]\n"})
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("/etc/passwd", ws / "passwd-link")
    os.mkfifo(ws / "pipe")
    store = store_for(root)

    summary = store.take(ws, 0, "baseline")

    assert summary.added == ("a.txt", "passwd-link", "run.sh", "src/main.py")
    assert summary.skipped == ("pipe",)
    assert summary.complete and summary.turn == 0 and len(summary.snapshot) == 40
    members = tar_members(store, 0)
    assert members["passwd-link"].issym() and members["passwd-link"].linkname == "/etc/passwd"
    assert members["run.sh"].mode == 0o755 and members["a.txt"].mode == 0o644
    assert not any(n.startswith((".home", ".git")) for n in members)
    assert store.turns() == [0]
    assert store.path.parent == root / "snapshots"


def test_summary_lists_changes_and_counts_lines_binary_as_zero(root: Path, ws: Path) -> None:
    write_tree(ws, {"a.txt": "one\ntwo\n", "gone.txt": "x\n", "keep.txt": "k\n"})
    store = store_for(root)
    store.take(ws, 0, "baseline")
    write_tree(ws, {"a.txt": "one\n2\nthree\n", "new.bin": b"\0\1\2\3", "new.txt": "n\n"})
    (ws / "gone.txt").unlink()

    summary = store.take(ws, 1, "edit things")

    assert summary.added == ("new.bin", "new.txt")
    assert summary.modified == ("a.txt",)
    assert summary.deleted == ("gone.txt",)
    assert (summary.lines_added, summary.lines_removed) == (3, 2)


def test_unchanged_workspace_gives_empty_summary_and_new_turn_ref(root: Path, ws: Path) -> None:
    write_tree(ws, {f"d{i}/f{j}.txt": f"{i} {j}\n" for i in range(5) for j in range(20)})
    store = store_for(root)
    first = store.take(ws, 0, "baseline")
    second = store.take(ws, 1, "nothing")
    assert (second.added, second.modified, second.deleted) == ((), (), ())
    assert second.snapshot != first.snapshot
    assert git(store.path, "rev-parse", f"{second.snapshot}^") == first.snapshot
    assert git(store.path, "log", "-1", "--format=%s%n%an <%ae>", "refs/turns/1") == (
        "nothing\nharness-worker <harness-worker@localhost>"
    )
    tip = store.path / "refs" / "harness" / "tip"
    inode = tip.stat().st_ino
    third = store.take(ws, 2, "nothing again")
    # The tip moves by an overwrite of its file, which git reads as it reads any loose ref.
    assert tip.stat().st_ino == inode
    assert git(store.path, "rev-parse", "refs/harness/tip") == third.snapshot
    assert git(store.path, "rev-parse", "refs/turns/2^") == second.snapshot
    git(store.path, "fsck", "--no-progress", "--strict")
    assert store_for(root).take(ws, 3, "a fresh process").added == ()


def test_file_rewritten_with_same_size_and_forged_mtime_is_seen(root: Path, ws: Path) -> None:
    write_tree(ws, {"a.txt": "aaaa"})
    store = store_for(root)
    store.take(ws, 0, "baseline")
    before = (ws / "a.txt").stat()
    (ws / "a.txt").write_text("bbbb")
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime still moves
    assert store.take(ws, 1, "sneaky").modified == ("a.txt",)


def test_large_file_is_recorded_by_hash_and_export_lists_it(root: Path, ws: Path) -> None:
    write_tree(ws, {"big.bin": b"x" * 5000, "small.txt": "s\n"})
    store = store_for(root, max_file_bytes=1000)
    summary = store.take(ws, 0, "baseline")
    assert summary.large == ("big.bin",)
    placeholder = tar_text(store, 0, "big.bin")
    assert placeholder.startswith("harness-large-file sha256=") and "size=5000" in placeholder
    assert "big.bin" in tar_text(store, 0, ".harness-omitted")


def test_max_files_bound_completes_with_what_it_has_and_deletes_nothing(
    root: Path, ws: Path
) -> None:
    write_tree(ws, {f"f{i:02d}.txt": f"{i}\n" for i in range(10)})
    store_for(root).take(ws, 0, "baseline")
    for i in range(10):
        (ws / f"f{i:02d}.txt").unlink()
    write_tree(ws, {f"g{i:02d}.txt": "new\n" for i in range(10)})

    summary = store_for(root, max_files=4).take(ws, 1, "many")

    assert not summary.complete and "max_files=4" in summary.note
    assert len(summary.added) == 4 and summary.deleted == ()


def test_diff_shows_text_and_names_binary_files(root: Path, ws: Path) -> None:
    write_tree(ws, {"a.txt": "one\n", "b.bin": b"\0\1"})
    store = store_for(root)
    store.take(ws, 0, "baseline")
    write_tree(ws, {"a.txt": "one\ntwo\n", "b.bin": b"\0\2\3"})
    store.take(ws, 1, "edit")

    text = b"".join(store.diff(0, 1)).decode()

    assert "+two" in text and "diff --git a/a.txt b/a.txt" in text
    assert "Binary files a/b.bin and b/b.bin differ" in text
    assert b"".join(store.diff(1, 1)) == b""


def test_unknown_turn_is_refused(root: Path, ws: Path) -> None:
    store = store_for(root)
    store.take(ws, 0, "baseline")
    with pytest.raises(UnknownSnapshot, match="turn 7"):
        list(store.diff(0, 7))
    with pytest.raises(UnknownSnapshot):
        store.export(3, io.BytesIO(), 100)


def test_export_above_ceiling_is_refused_naming_it(root: Path, ws: Path) -> None:
    write_tree(ws, {"a.txt": "x" * 3000})
    store = store_for(root)
    store.take(ws, 0, "baseline")
    out = io.BytesIO()
    with pytest.raises(ExportTooLarge, match="export ceiling of 1000 bytes"):
        store.export(0, out, 1000)
    assert out.getvalue() == b""
    assert store.export(0, out, 3000) == len(out.getvalue()) > 0


def test_rewind_restores_tree_leaves_ignored_paths_and_next_turn_diffs_from_it(
    root: Path, ws: Path
) -> None:
    write_tree(ws, {"a.txt": "one\n", "dir/b.txt": "b\n", "file-or-dir": "f\n"})
    os.symlink("a.txt", ws / "link")
    store = store_for(root)
    store.take(ws, 0, "baseline")
    write_tree(ws, {"a.txt": "changed\n", "new/c.txt": "c\n", ".git/HEAD": "ref: x\n"})
    (ws / "dir" / "b.txt").unlink()
    (ws / "file-or-dir").unlink()
    write_tree(ws, {"file-or-dir/inner.txt": "i\n"})
    (ws / "link").unlink()
    os.symlink("/etc", ws / "link")
    os.mkfifo(ws / "fifo")
    store.take(ws, 1, "turn one")

    rewind = store.restore(ws, 0, UID, GID, as_turn=1)

    assert rewind.rewound_to == 0 and rewind.turn == 1
    assert rewind.deleted == ("file-or-dir/inner.txt", "new/c.txt")
    assert set(rewind.modified) == {"a.txt", "link"} and "dir/b.txt" in rewind.added
    assert (ws / "a.txt").read_text() == "one\n" and (ws / "dir/b.txt").read_text() == "b\n"
    assert (ws / "file-or-dir").read_text() == "f\n" and os.readlink(ws / "link") == "a.txt"
    assert not (ws / "new").exists() and not (ws / "fifo").exists()
    assert (ws / ".home/session.json").read_text() == "vendor session"
    assert (ws / ".git/HEAD").read_text() == "ref: x\n"
    if os.geteuid() == 0:
        assert (ws / "a.txt").stat().st_uid == UID and (ws / "a.txt").stat().st_gid == GID
    assert git(store.path, "for-each-ref", "--format=%(refname)", "refs/rewinds/") == (
        "refs/rewinds/1"
    )
    assert b"".join(store.diff(0, 1))  # turn 1 still means "after turn 1"

    write_tree(ws, {"a.txt": "one\nmore\n"})
    turn2 = store.take(ws, 2, "turn two")
    assert (turn2.modified, turn2.added, turn2.deleted) == (("a.txt",), (), ())
    assert git(store.path, "rev-parse", "refs/turns/2^") == rewind.snapshot


def test_rewind_of_a_large_file_needs_the_recorded_hash(root: Path, ws: Path) -> None:
    write_tree(ws, {"big.bin": b"x" * 5000})
    store = store_for(root, max_file_bytes=1000)
    store.take(ws, 0, "baseline")
    write_tree(ws, {"big.bin": b"y" * 5000, "extra.txt": "e\n"})
    store.take(ws, 1, "changed")
    rewind = store.restore(ws, 0, UID, GID, as_turn=1)
    assert not rewind.complete and "big.bin" in rewind.note
    assert (ws / "big.bin").read_bytes() == b"y" * 5000  # left as it is
    assert not (ws / "extra.txt").exists()

    write_tree(ws, {"big.bin": b"x" * 5000})
    store.take(ws, 2, "back")
    again = store.restore(ws, 0, UID, GID, as_turn=2)
    assert again.complete and (ws / "big.bin").read_bytes() == b"x" * 5000


def test_extra_ignore_patterns_by_name_and_from_root(root: Path, ws: Path) -> None:
    write_tree(
        ws,
        {"node_modules/x.js": "x", "a/node_modules/y.js": "y", "build/out.o": "o",
         "src/build/keep.c": "k", "m.pyc": "c", "m.py": "p"},
    )  # fmt: skip
    store = store_for(root, ignore=("node_modules", "/build", "*.pyc"))
    assert store.take(ws, 0, "baseline").added == ("m.py", "src/build/keep.c")


def test_push_sends_turns_as_fast_forward_commits_to_git_daemon(
    root: Path, ws: Path, tmp_path: Path
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    git(served, "init", "-q", "--bare", "remote.git")
    write_tree(ws, {"a.txt": "one\n"})
    store = store_for(root)
    store.take(ws, 0, "baseline")
    write_tree(ws, {"a.txt": "two\n"})
    store.take(ws, 1, "fix the bug\n\nmore words")
    with git_daemon(served) as url:
        store.push(f"{url}/remote.git", "agent/work", 1, {})
        store.restore(ws, 0, UID, GID, as_turn=1)
        write_tree(ws, {"b.txt": "b\n"})
        store.take(ws, 2, "after the rewind")
        store.push(f"{url}/remote.git", "agent/work", 2, {})
    remote = served / "remote.git"
    log = git(remote, "log", "--format=%s", "agent/work").splitlines()
    assert log == ["after the rewind", "rewind to turn 0", "fix the bug", "baseline"]
    assert git(remote, "show", "agent/work:b.txt") == "b"


def test_remove_deletes_the_store(root: Path, ws: Path) -> None:
    store = store_for(root)
    store.take(ws, 0, "baseline")
    assert store.exists()
    store.remove()
    assert not store.exists() and store.turns() == []


def test_export_keeps_long_and_non_ascii_names_and_link_targets(root: Path, ws: Path) -> None:
    long_name = "d" * 120 + "/" + "f" * 110 + ".txt"
    write_tree(ws, {long_name: "long\n", "caf\u00e9.txt": "caf\n"})
    os.symlink("t" * 150, ws / "far-link")
    store = store_for(root)
    store.take(ws, 0, "baseline")
    members = tar_members(store, 0)
    assert members[long_name].isfile() and members["d" * 120].isdir()
    assert members["far-link"].linkname == "t" * 150
    assert tar_text(store, 0, "caf\u00e9.txt") == "caf\n"
