"""Row 7: work in, work out (issue 15). For a 10,000-file tree (smoke profile: 300): the
per-turn snapshot with 10 files changed against a bare ``git add -A && git commit`` of the
same tree in a plain repository, the snapshot of an unchanged tree against the floor of a bare
``git status --porcelain`` (and ``git add -A``) with an up-to-date index, rewind p50/p95 against a
bare ``git checkout`` of the same change, export p50/p95 against a bare ``tar -czf`` of the
tree, and seeding from a 10,000-file tar.gz (snapshot turn 0 included) against a bare
``tar -xzf``. Ours and the baseline alternate within each repeat, so drift on a shared machine
hits both alike. Needs no worker, Redis or Docker: the primitives are timed in this process."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.context import Bench
from bench.stats import p50, percentile
from bench.table import Figure, RowResult
from sandbox.store.seeding import ArchiveLimits, seed_from_archive
from sandbox.store.snapshots import SnapshotStore

SIZES = {"full": (10_000, 15), "quick": (10_000, 7), "smoke": (300, 3)}
"""Profile -> (files in the tree, repeats of each measure)."""
CHANGED = 10
SNAPSHOT_RATIO_TARGET = 1.2
UNCHANGED_TARGET_MS = 30.0
OWNER = (1000, 1000) if os.geteuid() == 0 else (os.getuid(), os.getgid())


def _git(cwd: Path, *args: str) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@localhost",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@localhost",
    }
    subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, env=env, check=True,
                   capture_output=True)  # fmt: skip


def _timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def make_tree(root: Path, files: int) -> list[str]:
    """``files`` source-like files in 100 directories; their paths."""
    paths = []
    for i in range(files):
        path = f"pkg{i % 100:02d}/module_{i:05d}.py"
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(30)))
        paths.append(path)
    return paths


def edit(root: Path, paths: list[str], round_: int) -> None:
    step = max(1, len(paths) // CHANGED)
    for path in paths[::step][:CHANGED]:
        with open(root / path, "a") as f:
            f.write(f"# round {round_}\n")


def run(bench: Bench) -> RowResult:
    files, repeats = SIZES.get(bench.profile, SIZES["full"])
    result = RowResult("7", f"work in, work out ({files:,} files, {CHANGED} changed per turn)")
    base = bench.tmp / "row7"
    shutil.rmtree(base, ignore_errors=True)
    root = base / "root"
    ws = root / "run" / "r7"
    ws.mkdir(parents=True)
    plain = base / "plain"
    plain.mkdir()
    paths = make_tree(ws, files)
    make_tree(plain, files)
    os.chown(ws, *OWNER)
    _git(plain, "init", "-q", "-b", "main")
    _git(plain, "add", "-A")
    _git(plain, "commit", "-q", "-m", "base")
    store = SnapshotStore(root, "r7")
    store.take(ws, 0, "baseline")

    ours: dict[str, list[float]] = {k: [] for k in ("take", "unchanged", "restore", "export")}
    base_t: dict[str, list[float]] = {k: [] for k in ("take", "status", "add", "restore", "export")}
    turn = 0
    correct = True
    for r in range(repeats):
        # Per-turn snapshot, 10 files changed.
        edit(ws, paths, r)
        turn += 1
        started = time.perf_counter()
        summary = store.take(ws, turn, f"turn {turn}")
        ours["take"].append(time.perf_counter() - started)
        correct &= len(summary.modified) == CHANGED
        edit(plain, paths, r)
        base_t["take"].append(_timed(["sh", "-c", "git add -A && git commit -q -m turn"], plain))
        # Unchanged tree.
        turn += 1
        started = time.perf_counter()
        store.take(ws, turn, f"turn {turn}")
        ours["unchanged"].append(time.perf_counter() - started)
        base_t["status"].append(_timed(["git", "status", "--porcelain"], plain))
        base_t["add"].append(_timed(["git", "add", "-A"], plain))
        # Rewind to turn 0 (undoes every edit so far) against checking out the base commit.
        started = time.perf_counter()
        rewind = store.restore(ws, 0, *OWNER, as_turn=turn)
        ours["restore"].append(time.perf_counter() - started)
        correct &= rewind.complete and len(rewind.modified) == CHANGED
        base_t["restore"].append(_timed(["git", "checkout", "-q", "main~" + str(r + 1)], plain))
        _git(plain, "checkout", "-q", "main")
        # Export against tar -czf of the same tree.
        sink = io.BytesIO()
        started = time.perf_counter()
        store.export(turn, sink, 1 << 40)
        ours["export"].append(time.perf_counter() - started)
        out = base / "bare.tgz"
        base_t["export"].append(
            _timed(["tar", "-czf", str(out), "--exclude=.git", "-C", str(plain), "."], base)
        )
    result.checks["every snapshot saw the 10 changed files, every rewind undid them"] = correct

    seed_ours, seed_base = _seeding(base, plain, repeats)
    ratio = p50(ours["take"]) / p50(base_t["take"])
    unchanged_ms = p50(ours["unchanged"]) * 1000
    result.add(
        Figure(
            "snapshot, 10 files changed p50 vs git add -A && git commit",
            p50(ours["take"]) * 1000, p50(base_t["take"]) * 1000, "ms",
            target=f"<= {SNAPSHOT_RATIO_TARGET:g}x", met=ratio <= SNAPSHOT_RATIO_TARGET,
        ),
        Figure(
            "snapshot, unchanged tree p50 vs git status --porcelain", unchanged_ms,
            p50(base_t["status"]) * 1000, "ms",
            target=f"<= {UNCHANGED_TARGET_MS:g} ms", met=unchanged_ms <= UNCHANGED_TARGET_MS,
        ),
    )  # fmt: skip
    for name, label, baseline in (
        ("restore", "rewind to turn 0", "git checkout"),
        ("export", "export tar.gz", "tar -czf"),
    ):
        for pct in (50, 95):
            result.add(
                Figure(
                    f"{label} p{pct} vs {baseline}",
                    percentile(ours[name], pct) * 1000,
                    percentile(base_t[name], pct) * 1000,
                    "ms",
                )
            )
    result.add(
        Figure(
            f"seed from a {files:,}-file tar.gz (+ turn 0) p50 vs tar -xzf",
            p50(seed_ours) * 1000, p50(seed_base) * 1000, "ms",
        )
    )  # fmt: skip
    result.notes.append(
        f"{repeats} repeats on {files:,} files; a snapshot rescans the directories inotify saw "
        "change (a full walk when the watch is not sure), then one git fast-import and one git "
        "diff-tree --numstat; an unchanged tree's commit is written without git. A bare "
        f"git add -A of the unchanged tree (index up to date): {p50(base_t['add']) * 1000:.1f} "
        "ms p50"
    )
    store.release()  # as the run's end does: the process forgets its watch and manifest
    shutil.rmtree(base, ignore_errors=True)
    return result


def _seeding(base: Path, plain: Path, repeats: int) -> tuple[list[float], list[float]]:
    archive = base / "seed.tgz"
    subprocess.run(
        ["tar", "-czf", str(archive), "--exclude=.git", "-C", str(plain), "."], check=True
    )
    ours, bare = [], []
    for r in range(repeats):
        root = base / f"seed{r}"
        ws = root / "run" / "s"
        (ws / ".home").mkdir(parents=True)
        started = time.perf_counter()
        store = SnapshotStore(root, "s")
        seed_from_archive(store, ws, archive, ArchiveLimits(), *OWNER)
        ours.append(time.perf_counter() - started)
        store.release()
        target = base / f"bare{r}"
        target.mkdir()
        bare.append(_timed(["tar", "-xzf", str(archive), "-C", str(target)], base))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
    return ours, bare
