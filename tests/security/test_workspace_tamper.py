"""A workspace written by a hostile agent: the snapshot store runs none of it (no fsmonitor,
hook, filter, textconv or export rule), follows none of its links, exports only the links
themselves, and a rewind never writes outside the workspace."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandbox.store.snapshots import SnapshotStore
from tests.unit.sandbox_snapshots.git_fixtures import GID, UID, git, git_daemon, write_tree


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "MARKER"


@pytest.fixture
def hostile(tmp_path: Path, marker: Path) -> tuple[Path, SnapshotStore]:
    root = tmp_path / "root"
    ws = root / "run" / "r1"
    script = f"#!/bin/sh\ntouch {marker}\ncat\n"
    evil = {
        ".git/config": (
            "[core]\n\tfsmonitor = /workspace/evil.sh\n\thooksPath = .git/hooks\n"
            f"\tpager = touch {marker}\n\teditor = touch {marker}\n"
            f'[filter "evil"]\n\tclean = touch {marker}\n\tsmudge = touch {marker}\n'
            f'[diff "evil"]\n\ttextconv = touch {marker}\n\tcommand = touch {marker}\n'
        ),
        ".gitattributes": "* filter=evil diff=evil\n*.txt export-subst\nsecret export-ignore\n",
        "evil.sh": script,
        "notes.txt": "$Format:%H$\n",
        "secret": "kept\n",
        "sub/.gitattributes": "* filter=evil\n",
    }
    write_tree(ws, evil)
    for hook in ("pre-commit", "post-commit", "pre-push", "post-checkout", "reference-transaction",
                 "fsmonitor-watchman", "pre-receive", "post-update"):  # fmt: skip
        write_tree(ws, {f".git/hooks/{hook}": script})
        os.chmod(ws / ".git" / "hooks" / hook, 0o755)
    os.chmod(ws / "evil.sh", 0o755)
    (ws / ".git" / "config").write_text(
        (ws / ".git" / "config").read_text().replace("/workspace/evil.sh", str(ws / "evil.sh"))
    )
    store = SnapshotStore(root, "r1")
    os.symlink("/etc/passwd", ws / "passwd")
    os.symlink("/etc", ws / "etc")
    os.symlink(str(store.path), ws / "store")
    (ws / "nested").mkdir()
    os.symlink("/etc", ws / "nested" / ".git")  # a .git that is a symlink
    os.mkfifo(ws / "fifo")
    return ws, store


def test_take_diff_export_restore_push_run_nothing_the_agent_wrote(
    hostile: tuple[Path, SnapshotStore], marker: Path, tmp_path: Path
) -> None:
    ws, store = hostile
    first = store.take(ws, 0, "baseline")
    write_tree(ws, {"notes.txt": "changed $Format:%H$\n", "new.txt": "n\n"})
    store.take(ws, 1, "turn one")
    diff = b"".join(store.diff(0, 1)).decode()
    out = io.BytesIO()
    store.export(1, out, 10**8)
    store.restore(ws, 0, UID, GID, as_turn=1)
    served = tmp_path / "served"
    served.mkdir()
    git(tmp_path, "init", "-q", "--bare", str(served / "r.git"))
    with git_daemon(served) as url:
        store.push(f"{url}/r.git", "work", 1, {})

    assert not marker.exists(), "the worker ran something the agent wrote"
    assert "fifo" in first.skipped and "+changed $Format:%H$" in diff
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        notes = tar.extractfile("notes.txt")
        assert notes is not None and notes.read() == b"changed $Format:%H$\n"  # no export-subst
    assert "secret" in members  # no export-ignore
    assert members["passwd"].issym() and members["passwd"].linkname == "/etc/passwd"
    assert members["store"].issym() and members["etc"].issym()
    assert not any(name.startswith(("etc/", "store/", ".git/", ".home")) for name in members)
    assert "nested/.git" not in members
    assert all(m.size < 1000 for m in members.values())  # nothing of /etc/passwd's size


def test_directory_swapped_for_a_symlink_is_never_written_through(
    tmp_path: Path, marker: Path
) -> None:
    root = tmp_path / "root"
    ws = root / "run" / "r1"
    outside = tmp_path / "outside"
    outside.mkdir()
    write_tree(ws, {"d/f.txt": "mine\n", "e/g.txt": "g\n"})
    store = SnapshotStore(root, "r1")
    store.take(ws, 0, "baseline")
    # The agent replaces d/ by a link to a host directory and e/g.txt by a link to a host file.
    for name in ("d", "e"):
        for child in (ws / name).iterdir():
            child.unlink()
        (ws / name).rmdir()
    os.symlink(outside, ws / "d")
    (ws / "e").mkdir()
    (outside / "host.txt").write_text("host file\n")
    os.symlink(outside / "host.txt", ws / "e" / "g.txt")
    turn1 = store.take(ws, 1, "swap")
    assert set(turn1.modified) == {"e/g.txt"} and "d" in turn1.added

    store.restore(ws, 0, UID, GID, as_turn=1)

    assert sorted(os.listdir(outside)) == ["host.txt"]
    assert (outside / "host.txt").read_text() == "host file\n"
    assert not (ws / "d").is_symlink() and (ws / "d" / "f.txt").read_text() == "mine\n"
    assert not (ws / "e" / "g.txt").is_symlink() and (ws / "e" / "g.txt").read_text() == "g\n"


def test_restoring_a_recorded_symlink_writes_the_link_not_through_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "run" / "r1"
    outside = tmp_path / "outside"
    outside.mkdir()
    ws.mkdir(parents=True)
    os.symlink(outside, ws / "out")
    store = SnapshotStore(root, "r1")
    store.take(ws, 0, "a link to a host directory")
    (ws / "out").unlink()
    write_tree(ws, {"out/planted.txt": "x\n"})
    store.take(ws, 1, "a real directory")
    store.restore(ws, 0, UID, GID, as_turn=1)
    assert os.readlink(ws / "out") == str(outside) and os.listdir(outside) == []
    store.restore(ws, 1, UID, GID, as_turn=1)
    assert not (ws / "out").is_symlink() and os.listdir(outside) == []


def test_a_workspace_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    from sandbox.store.snapshots import SnapshotError

    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    os.symlink("/etc", root / "run" / "r1")
    with pytest.raises(SnapshotError):
        SnapshotStore(root, "r1").take(root / "run" / "r1", 0, "baseline")
