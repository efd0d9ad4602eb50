"""The record of a run's work: a snapshot of its workspace after every turn, that the agent
cannot alter.

**Where.** A bare git repository owned by the worker, ``<root>/snapshots/<run_id>``, outside
every workspace and never mounted into a container. No git process ever runs with a
workspace as its work tree or git directory: a snapshot reads only file contents, through
:mod:`sandbox.store.scan` (directory descriptors, no link followed), and every git process
is hardened (:mod:`sandbox.store.git_run`): no config, hooks or attributes from anywhere an agent
can write; the store's ``info/attributes`` neutralises any ``.gitattributes`` in a tree.

**Refs and numbering.** ``refs/turns/<N>`` is the workspace after turn N (turn 0: the
baseline, after seeding or of the initial workspace). Every commit, turn or rewind, extends
one linear chain whose tip is ``refs/harness/tip``, so history only grows and a push is
always a fast-forward. A rewind to turn k taken after turn N is a commit restoring turn k's
tree, recorded as ``refs/rewinds/<seq>`` (1, 2, ...; message ``rewind to turn k``); it does
not move ``refs/turns/<N>``, which keeps meaning "after turn N". The next
``take(turn=N+1)`` builds on the tip, so its summary is what turn N+1 changed from the
rewound state, while ``diff(N, N+1)`` still compares the two turns' trees. Taking a turn
number again moves its ref to the new commit. A seeded store has ``refs/harness/seed`` (the
seed commit), the parent of turn 0.

**Stat cache.** ``harness-manifest`` (marshal, worker-owned) holds the tip's manifest: path ->
(mode, blob id, size, mtime, ctime, inode); an unchanged file is not read again. It names the
commit it describes; if that is not the tip, the manifest is rebuilt from the tip's tree with
every entry untrusted (every file read once).

**Between snapshots** (:mod:`sandbox.store.watch`): the process keeps the tip's manifest in
memory (checked against the manifest's commit pointer and the file's stat) and an inotify
watch of the workspace; while the watch has been unbroken since the walk that produced the
tip, a snapshot lists again only the directories changed since (and those holding a racy
entry) and keeps every other entry; anything uncertain is a full walk. A snapshot that changes
nothing writes its commit and refs itself (no git process, see
:func:`sandbox.store.git_objects.write_commit`).

**Large files, ignore rules, bounds:** see :mod:`sandbox.store.scan`. A snapshot cut short
by a bound still commits what it read, records no deletion (unreached paths keep their
previous record) and says ``complete=False`` and why.

Operations on one store are serialised by a lock file; different runs never share a store.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import marshal
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from sandbox.base import ExportTooLarge, GitError, SnapshotError, UnknownSnapshot, UnsafePath
from sandbox.small_files import rewrite_in_place
from sandbox.store.export import write_tar_gz
from sandbox.store.git_objects import (
    EMPTY_TREE,
    BlobReader,
    FastImport,
    ls_tree,
    write_commit,
    write_object,
    write_ref,
)
from sandbox.store.git_run import (
    NEUTRAL_ATTRIBUTES,
    empty_home,
    popen_git,
    redact,
    run_git,
)
from sandbox.store.safe_fs import SafeWriter
from sandbox.store.scan import (
    MODE_EXEC,
    MODE_LINK,
    BlobSink,
    Entry,
    IgnoreRules,
    Record,
    ScanBounds,
    Scanner,
    ScanResult,
    parse_placeholder,
    placeholder,
    stamp,
)
from sandbox.store.watch import FULL_WALK_EVERY, Watch, forget, watch_of
from sandbox.workspace import safe_name

TIP = "refs/harness/tip"
SEED = "refs/harness/seed"
MANIFEST = "harness-manifest"
TEMPLATE = ".template"
"""The empty store every new store is copied from, beside them (no run id starts with a dot)."""
MANIFEST_VERSION = 1
MiB = 1024 * 1024
PREFETCH_BYTES = 64 * MiB
"""A rewind keeps up to this much of the blobs it read to classify, instead of reading again."""
_OBJECT_ID = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class SnapshotLimits:
    """Operator bounds of one snapshot (see :mod:`sandbox.store.scan`)."""

    max_file_bytes: int = 10 * MiB
    """A file above this is recorded by SHA-256 and size, not kept."""
    max_total_bytes: int = 2048 * MiB
    """The sum of the sizes recorded in one snapshot."""
    max_files: int = 200_000
    timeout_s: float = 120.0
    """Bounds the walk of one snapshot, and each git process a store operation starts."""
    ignore: tuple[str, ...] = ()
    """Patterns ignored besides ``/.home`` and ``.git`` (``/x``: from the root; ``x``: a name
    at any depth; fnmatch syntax)."""
    watch: bool = True
    """Rescan only what inotify saw change (:mod:`sandbox.store.watch`); False: walk the whole
    tree every time, for a workspace whose writes do not reach this host's inotify (a Docker
    daemon in a VM, NFS, FUSE)."""


@dataclass(frozen=True)
class SnapshotSummary:
    """What one snapshot changed against the one before it in the chain (full sorted lists)."""

    turn: int
    snapshot: str
    added: tuple[str, ...]
    modified: tuple[str, ...]
    deleted: tuple[str, ...]
    lines_added: int
    lines_removed: int
    large: tuple[str, ...] = ()
    """Paths recorded by hash and size only (every large file of the snapshot)."""
    skipped: tuple[str, ...] = ()
    """Sockets, FIFOs, devices, entries that vanished or turned into links while read."""
    complete: bool = True
    note: str = ""
    rewound_to: int | None = None
    """Set on a rewind's summary: the turn whose tree was restored."""


class SnapshotStore:
    """One run's snapshot store. Creating the object touches nothing; :meth:`take` creates
    the repository on first use."""

    def __init__(self, root: Path, run_id: str, limits: SnapshotLimits = SnapshotLimits()) -> None:
        self.root = root
        self.run_id = safe_name(run_id, "run id")
        self.path = root / "snapshots" / self.run_id
        self.limits = limits
        self.rules = IgnoreRules(limits.ignore)

    # -- queries -------------------------------------------------------------------------

    def exists(self) -> bool:
        return (self.path / "HEAD").is_file()

    def turns(self) -> list[int]:
        """The turns that have a snapshot, in order."""
        if not self.exists():
            return []
        out = self._git(["for-each-ref", "--format=%(refname)", "refs/turns/"])
        numbers = []
        for line in out.decode().split():
            tail = line.rsplit("/", 1)[-1]
            if tail.isdigit():
                numbers.append(int(tail))
        return sorted(numbers)

    def seed_commit(self) -> str | None:
        """The commit the workspace was seeded from (a repository seed), else None."""
        return self._resolve(SEED) if self.exists() else None

    def commit_of(self, turn: int) -> str:
        """The commit id of turn ``turn``; :class:`UnknownSnapshot` when there is none."""
        commit = self._resolve(f"refs/turns/{int(turn)}")
        if commit is None:
            raise UnknownSnapshot(f"run {self.run_id} has no snapshot of turn {turn}")
        return commit

    # -- recording -----------------------------------------------------------------------

    def take(
        self,
        workspace: Path,
        turn: int,
        message: str,
        *,
        fresh: Mapping[str, Entry] | None = None,
    ) -> SnapshotSummary:
        """Record the workspace as turn ``turn``'s snapshot and summarise what changed since
        the previous snapshot in the chain (a rewind included).

        ``fresh``: files the worker itself has just written, with nothing else writing to the
        workspace since (a seed), their blobs already in the store (see :meth:`add_blobs`);
        one whose stat still matches is not read again."""
        with self._locked():
            parent = self._resolve(TIP) or self._resolve(SEED)
            watch = self._watch()
            covered, watch.covers = watch.covers, None  # until this snapshot is written
            previous = self._manifest(parent, watch)
            importer = _Importer(self.path, self._home())
            try:
                trusted = covered is not None and covered == parent and not fresh
                scan, record, touched = self._observe(
                    workspace, previous, importer, watch, trusted, fresh or {}
                )
                current = scan.entries
                if not scan.complete:
                    # Unreached paths keep their previous record: nothing is deleted.
                    current = {**previous, **current}
                commit, changes = self._commit(
                    importer, f"refs/turns/{int(turn)}", message, parent, previous, current,
                    touched, watch,
                )  # fmt: skip
            except (OSError, UnsafePath, GitError) as exc:
                importer.abort()
                raise SnapshotError(f"cannot snapshot turn {turn}: {exc}") from exc
            self._save_manifest(commit, current, previous, changes, watch)
            watch.record = record
            watch.covers = commit if record is not None else None
        return self._summary(turn, commit, parent, changes, scan)

    def take_empty(self, turn: int, message: str) -> SnapshotSummary:
        """Record an empty workspace as turn ``turn``'s snapshot without looking at it: the
        workspace of a new run with no seed and no durable workspace, empty by construction
        (not made yet, even). Its next snapshot walks the whole tree. A store that has a
        snapshot already is refused (SnapshotError): it is no new run's."""
        with self._locked():
            if self._resolve(TIP) or self._resolve(SEED):
                raise SnapshotError(f"cannot record turn {turn} as empty: the store has snapshots")
            watch = self._watch()
            watch.covers = watch.record = None
            tree = write_object(self.path, b"tree", b"")
            commit = write_commit(self.path, tree, None, message, int(time.time()))
            write_ref(self.path, f"refs/turns/{int(turn)}", commit)
            write_ref(self.path, TIP, commit)
            watch.remember_tree(commit, tree)
            nothing = _Changes.between({}, {}, [])
            self._save_manifest(commit, {}, {}, nothing, watch)
        return self._summary(turn, commit, None, nothing, ScanResult())

    @contextlib.contextmanager
    def add_blobs(self) -> Iterator[BlobSink]:
        """A sink of (blob id, bytes) into the store (created if need be), for the blobs of
        files a ``take(fresh=...)`` will name; written when the block ends without error."""
        self.init()
        importer = FastImport(self.path, self._home())
        try:
            yield importer.blob
        except BaseException:
            importer.abort()
            raise
        try:
            importer.finish()
        except (OSError, GitError) as exc:
            raise SnapshotError(f"cannot store the seed's files: {exc}") from exc

    def restore(
        self, workspace: Path, turn: int, uid: int, gid: int, *, as_turn: int
    ) -> SnapshotSummary:
        """Make the workspace equal to turn ``turn``'s snapshot (ignored paths untouched),
        record the result as the next rewind commit and summarise it against the state before.

        ``as_turn`` is the last turn taken (the rewind happens between it and the next); the
        summary carries it as ``turn`` and ``turn`` as ``rewound_to``. Only entries that differ
        are removed and written (through :class:`SafeWriter`, owned by ``uid:gid``). A large
        file comes back only if the file at its path still has the recorded hash; otherwise
        it is left as it is, named in the note, and ``complete`` is False.
        """
        target_commit = self.commit_of(turn)
        with self._locked():
            parent = self._resolve(TIP) or self._resolve(SEED)
            watch = self._watch()
            covered, watch.covers = watch.covers, None
            previous = self._manifest(parent, watch)
            target = self._tree_of(target_commit, parent, previous)
            importer = _Importer(self.path, self._home())
            try:
                trusted = covered is not None and covered == parent
                scan, _, _ = self._observe(workspace, previous, importer, watch, trusted, {})
                if not scan.complete:
                    raise SnapshotError(
                        f"cannot rewind: the workspace could not be read whole ({scan.note})"
                    )
                current, kept = self._apply(workspace, scan, target, uid, gid)
                seq = len(self._refs("refs/rewinds/")) + 1
                commit, changes = self._commit(
                    importer, f"refs/rewinds/{seq}", f"rewind to turn {turn}", parent,
                    previous, current, None, watch,
                )  # fmt: skip
            except (OSError, UnsafePath, GitError) as exc:
                importer.abort()
                raise SnapshotError(f"cannot rewind to turn {turn}: {exc}") from exc
            except SnapshotError:
                importer.abort()
                raise
            self._save_manifest(commit, current, previous, changes, watch)
            record = _restored_record(scan, current)
            watch.record = record
            watch.covers = commit if record is not None else None
        note = f"not restored (large file content not kept): {', '.join(kept)}" if kept else ""
        result = ScanResult(
            entries=current,
            large=sorted(p for p, e in current.items() if e.large),
            complete=not kept,
            note=note,
        )
        summary = self._summary(as_turn, commit, parent, changes, result)
        return _with_rewind(summary, turn)

    # -- getting work out ----------------------------------------------------------------

    def diff(self, from_turn: int, to_turn: int) -> Iterator[bytes]:
        """The unified diff from turn ``from_turn``'s snapshot to ``to_turn``'s, in chunks.
        Binary files are named (``Binary files a/x and b/x differ``), never dumped."""
        old, new = self.commit_of(from_turn), self.commit_of(to_turn)
        return self._stream_diff(old, new)

    def _stream_diff(self, old: str, new: str) -> Iterator[bytes]:
        args = [
            "diff-tree", "-p", "-r", "--no-renames", "--no-ext-diff", "--no-textconv",
            "--no-color", old, new,
        ]  # fmt: skip
        proc = popen_git(self.path, args, home=self._home())
        assert proc.stdout is not None and proc.stderr is not None
        try:
            while chunk := proc.stdout.read(65536):
                yield chunk
            if proc.wait(timeout=self.limits.timeout_s) != 0:
                tail = proc.stderr.read().decode("utf-8", "replace")[-500:]
                raise SnapshotError(f"cannot diff: {tail}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()

    def export(self, turn: int, out: BinaryIO, max_bytes: int) -> int:
        """Write turn ``turn``'s tree as a tar.gz to ``out``; the bytes written. Refused with
        :class:`ExportTooLarge`, before anything is written, when the files' total size passes
        ``max_bytes``."""
        commit = self.commit_of(turn)
        home = self._home()
        tree = ls_tree(self.path, commit, home, self.limits.timeout_s)
        total = sum(e.size for e in tree.values())
        if total > max_bytes:
            raise ExportTooLarge(
                f"the workspace after turn {turn} holds {total} bytes, "
                f"above the export ceiling of {max_bytes} bytes"
            )
        when = int(self._git(["show", "-s", "--format=%ct", commit]).decode().strip() or 0)
        try:
            return write_tar_gz(tree, self.path, home, out, when)
        except (OSError, GitError) as exc:
            raise SnapshotError(f"cannot export turn {turn}: {exc}") from exc

    def push(self, url: str, branch: str, turn: int, env: Mapping[str, str]) -> None:
        """Push turn ``turn``'s commit to ``refs/heads/<branch>`` of ``url``. Credentials only
        through ``env`` (see :func:`sandbox.store.seeding.git_auth_env`); never argv."""
        commit = self.commit_of(turn)
        safe_branch = _branch(branch, self._home())
        try:
            run_git(
                self.path,
                ["push", "--quiet", "--no-verify", url, f"{commit}:refs/heads/{safe_branch}"],
                home=self._home(),
                extra_env=env,
                timeout_s=self.limits.timeout_s,
            )
        except GitError as exc:
            raise SnapshotError(redact(str(exc), env)) from exc

    def release(self) -> None:
        """Drop this process's watch of the workspace and its copy of the manifest (the run
        ended here); the store stays. The next snapshot, if any, walks the whole tree."""
        forget(self._key())

    def remove(self) -> None:
        """Delete the store (the run's record) and drop this process's watch of it; absent
        is fine."""
        forget(self._key())
        shutil.rmtree(self.path, ignore_errors=True)

    # -- internals -----------------------------------------------------------------------

    def init(self) -> None:
        """Create the bare repository if it does not exist yet: a copy of the stores'
        template (made once, as :meth:`_make_repository` makes a store), renamed into place
        (three git processes cost a run's first snapshot more than the rest of it), written
        from this process's copy of it in memory (a copy of the tree, its stats and
        attributes, cost a first turn half its baseline snapshot)."""
        if self.exists():
            return
        template = self.path.parent / TEMPLATE
        if not (template / "HEAD").is_file():
            self._make_repository(template)
        staging = self.path.with_name(f".{self.run_id}.{os.getpid()}.{threading.get_ident()}")
        shutil.rmtree(staging, ignore_errors=True)
        folders, files = _template_of(str(template))
        staging.mkdir()
        for folder in folders:
            os.mkdir(staging / folder)
        for name, data in files:
            (staging / name).write_bytes(data)
        try:
            os.rename(staging, self.path)  # replaces nothing but an empty directory
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not self.exists():  # not another thread's store: something half made
                self._make_repository(self.path)

    def _make_repository(self, path: Path) -> None:
        """A store's bare repository at ``path``: made in a staging folder and renamed into
        place, or made whole where something half made is (git init is idempotent)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            target = path
        else:
            target = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
            shutil.rmtree(target, ignore_errors=True)
        run_git(None, ["init", "--bare", "--quiet", str(target)], home=self._home())
        (target / "info").mkdir(exist_ok=True)
        (target / "info" / "attributes").write_text(NEUTRAL_ATTRIBUTES)
        for key, value in (("gc.auto", "0"), ("core.logAllRefUpdates", "false")):
            run_git(target, ["config", key, value], home=self._home())
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(target / "hooks")
        if target != path:
            try:
                os.rename(target, path)
            except OSError:  # another thread made it meanwhile
                shutil.rmtree(target, ignore_errors=True)

    def _key(self) -> str:
        return os.path.abspath(self.path)

    def _watch(self) -> Watch:
        return watch_of(self._key())

    def _home(self) -> Path:
        return empty_home(self.root / "snapshots")

    def _git(self, args: list[str], **kwargs: object) -> bytes:
        return run_git(
            self.path, args, home=self._home(), timeout_s=self.limits.timeout_s,
            **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip

    def _resolve(self, ref: str) -> str | None:
        if not self.exists():
            return None
        # The store is the worker's and every ref in it points at a commit it wrote: a loose
        # ref is read as a file (a git process costs more than the rest of a small snapshot);
        # anything else (packed, symbolic, absent) is left to git.
        try:
            text = (self.path / ref).read_text().strip()
            if _OBJECT_ID.fullmatch(text):
                return text
        except FileNotFoundError:
            if not (self.path / "packed-refs").exists():
                return None  # every ref is loose (nothing packs a store's refs): there is none
        except (OSError, UnicodeDecodeError):
            pass
        try:
            out = self._git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
        except GitError:
            return None
        return out.decode().strip() or None

    def _refs(self, prefix: str) -> list[str]:
        if not (self.path / "packed-refs").exists():
            # Every ref is loose (gc and pack-refs never run on a store): list the files.
            with contextlib.suppress(FileNotFoundError):
                folder = self.path / prefix
                return [prefix + name for name in os.listdir(folder) if (folder / name).is_file()]
            return []
        return self._git(["for-each-ref", "--format=%(refname)", prefix]).decode().split()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.init()
        with open(self.path / "harness.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _manifest(self, commit: str | None, watch: Watch) -> dict[str, Entry]:
        if commit is None:
            return {}
        try:
            described = (self.path / f"{MANIFEST}.commit").read_text()
            cached = watch.manifest
            if (
                cached is not None
                and cached[0] == commit == described
                and _file_key(self.path / MANIFEST) == cached[1]
            ):
                return cached[2]  # type: ignore[no-any-return]
            with open(self.path / MANIFEST, "rb") as f:
                key = _file_key(f.fileno())
                data = marshal.loads(f.read())
            if data.get("version") == MANIFEST_VERSION and described == commit:
                make = tuple.__new__  # 10,000s of entries: skip NamedTuple's __new__
                read = {path: make(Entry, fields) for path, fields in data["entries"].items()}
                watch.manifest = (commit, key, read)
                return read
        except (OSError, EOFError, ValueError, TypeError, KeyError, AttributeError):
            # No manifest, or one of another commit: rebuilt from the tree below.
            pass
        tree = ls_tree(self.path, commit, self._home(), self.limits.timeout_s)
        entries: dict[str, Entry] = {}
        with BlobReader(self.path, self._home()) as blobs:
            for path, item in tree.items():
                size = item.size
                large = False
                if item.size < 200 and item.mode != MODE_LINK:
                    parsed = parse_placeholder(blobs.read(item.oid))
                    if parsed is not None:
                        large, size = True, parsed[1]
                entries[path] = Entry(item.mode, item.oid, size, large=large)
        return entries

    def _tree_of(
        self, commit: str, tip: str | None, tip_entries: Mapping[str, Entry]
    ) -> dict[str, tuple[str, str]]:
        """``commit``'s tree, path -> (mode, blob id): the tip's manifest (its exact tree)
        changed by ``git diff-tree`` from the tip, which reads only the subtrees that differ
        (listing every blob with ``ls-tree -r -l`` costs a size lookup per file)."""
        if tip is None:
            return {p: (e.mode, e.oid) for p, e in ls_tree(
                self.path, commit, self._home(), self.limits.timeout_s
            ).items()}  # fmt: skip
        tree = {path: (entry[0], entry[1]) for path, entry in tip_entries.items()}
        args = ["diff-tree", "-r", "-z", "--no-renames", "--no-textconv", tip, commit]
        fields = self._git(args).split(b"\0")
        for meta, raw_path in zip(fields[0:-1:2], fields[1::2], strict=True):
            _, new_mode, _, new_oid, status = meta.split(b" ")
            path = raw_path.decode("utf-8", "surrogateescape")
            if status == b"D" or new_mode == b"160000":  # gitlinks are not restored
                tree.pop(path, None)
            else:
                tree[path] = (new_mode.decode(), new_oid.decode())
        return tree

    def _save_manifest(
        self,
        commit: str,
        entries: dict[str, Entry],
        previous: Mapping[str, Entry],
        changes: _Changes,
        watch: Watch,
    ) -> None:
        """The manifest, and in a small file of its own the commit it describes; the process
        keeps ``entries`` as the manifest's copy.

        A snapshot whose tree is unchanged, taken on the manifest file as read, rewrites only
        the pointer, even if stats or trust changed: the file still names every path's exact
        mode and blob, and an entry whose stat it has wrong is only read again."""
        pointer = self.path / f"{MANIFEST}.commit"
        cached = watch.manifest
        on_disk = cached is not None and cached[2] is previous
        watch.manifest = None
        rewrite = (
            changes.any()
            or not (on_disk or entries is previous or entries == previous)
            or not (self.path / MANIFEST).exists()
        )
        if rewrite:
            pointer.unlink(missing_ok=True)  # never a new commit named next to an old manifest
            data = {
                "version": MANIFEST_VERSION,
                "entries": {path: tuple(entry) for path, entry in entries.items()},
            }
            temporary = self.path / f"{MANIFEST}.tmp"
            temporary.write_bytes(marshal.dumps(data))
            temporary.replace(self.path / MANIFEST)
        # The manifest as it is names this commit's tree too: only the pointer moves. A torn
        # pointer names no commit, and a manifest no pointer matches is read again from git.
        if rewrite or not rewrite_in_place(pointer, commit.encode(), create=False):
            temporary = self.path / f"{MANIFEST}.commit.tmp"
            temporary.write_text(commit)
            temporary.replace(pointer)
        watch.manifest = (commit, _file_key(self.path / MANIFEST), entries)

    def _observe(
        self,
        workspace: Path,
        previous: dict[str, Entry],
        importer: _Importer,
        watch: Watch,
        trusted: bool,
        fresh: Mapping[str, Entry],
    ) -> tuple[ScanResult, Record | None, list[str] | None]:
        """The workspace now: (the scan, its record for the next rescan or None, the paths
        that may have changed or None for all). A rescan of the dirty directories when the
        watch has covered ``previous`` unbroken (``trusted``), else a full walk that starts
        the watch again."""
        dirty, broken = watch.drain()
        limits = self.limits
        trusted = trusted and limits.watch
        deadline = time.monotonic() + limits.timeout_s
        record = watch.record
        if (
            trusted
            and not broken
            and isinstance(record, Record)
            and record.entries is previous
            and watch.since_full < FULL_WALK_EVERY
        ):
            watch.since_full += 1
            if not dirty and not record.untrusted:
                unchanged = ScanResult(
                    previous, record.dirs, sorted(record.large), sorted(record.skipped),
                    total=record.total,
                )  # fmt: skip
                return unchanged, record, []
            unbounded = ScanBounds(limits.max_file_bytes, 1 << 62, 1 << 62, deadline)
            scanner = Scanner(previous, unbounded, self.rules, importer.blob)
            rescanned = scanner.rescan(
                workspace, record, dirty, limits.max_files, limits.max_total_bytes
            )
            if rescanned is not None:
                return rescanned
        bounds = ScanBounds(
            limits.max_file_bytes, limits.max_total_bytes, limits.max_files, deadline
        )
        # git starts with the first new blob, while the rest of the tree is walked; a walk
        # that finds nothing new (an empty workspace, every FULL_WALK_EVERY-th snapshot of an
        # unchanged one) needs no git process.
        watch.since_full = 0
        if not limits.watch:
            scan = Scanner(previous, bounds, self.rules, importer.blob, fresh).scan(workspace)
            return scan, None, None
        watch.begin(self.rules.ignored)
        try:
            scan = Scanner(
                previous, bounds, self.rules, importer.blob, fresh, on_dir=watch.add
            ).scan(workspace)
        finally:
            watch.end()
        return scan, Record.of(scan), None

    def _commit(
        self,
        importer: _Importer,
        ref: str,
        message: str,
        parent: str | None,
        previous: Mapping[str, Entry],
        current: Mapping[str, Entry],
        touched: list[str] | None,
        watch: Watch,
    ) -> tuple[str, _Changes]:
        """Commit ``current`` on ``parent`` (``touched``: the only paths that can differ, None
        for any). An unchanged tree whose id this process knows, with no git process started,
        is written here; otherwise through fast-import."""
        changes = _Changes.between(previous, current, touched)
        when = int(time.time())
        tree = watch.trees.get(parent) if parent is not None else None
        if parent is None and not current and not importer.started:
            tree = write_object(self.path, b"tree", b"")  # an empty workspace's first snapshot
            assert tree == EMPTY_TREE
        if tree is not None and not changes.any() and not importer.started:
            commit = write_commit(self.path, tree, parent, message, when)
            write_ref(self.path, ref, commit)
            write_ref(self.path, TIP, commit)
            watch.remember_tree(commit, tree)
            return commit, changes
        modifies = [(p, current[p].mode, current[p].blob) for p in changes.added + changes.modified]
        fast_import = importer.start()
        commit = fast_import.commit(
            ref, message, parent, changes.deleted, modifies, when, extra_refs=(TIP,)
        )
        if fast_import.tree:
            watch.remember_tree(commit, fast_import.tree)
        return commit, changes

    def _apply(
        self,
        workspace: Path,
        scan: ScanResult,
        target: Mapping[str, tuple[str, str]],
        uid: int,
        gid: int,
    ) -> tuple[dict[str, Entry], list[str]]:
        """Change the workspace from ``scan`` to ``target``: (the resulting manifest, large
        files that could not be restored)."""
        have = scan.entries
        result: dict[str, Entry] = {}
        kept: set[str] = set()
        wanted: dict[str, tuple[str, str]] = {}
        fetched: dict[str, bytes] = {}
        budget = PREFETCH_BYTES
        home = self._home()
        with BlobReader(self.path, home) as blobs, SafeWriter(workspace, uid, gid) as writer:
            for path, item in target.items():
                old = have.get(path)
                if old is not None and old[0] == item[0] and old[1] == item[1]:
                    result[path] = old
                    continue
                if self.rules.ignored_path(path):
                    continue
                if item[0] != MODE_LINK:
                    # Whether it is a large file's placeholder (its content never kept).
                    data = blobs.read(item[1])
                    if len(data) < 200 and parse_placeholder(data) is not None:
                        kept.add(path)  # leave what is there
                        if old is not None:
                            result[path] = old
                        continue
                    if len(data) <= budget:
                        fetched[item[1]] = data
                        budget -= len(data)
                wanted[path] = item
            for path in scan.skipped:
                writer.remove(path)
            for path in sorted(have, reverse=True):
                if path not in result and path not in kept:
                    writer.remove(path)
            target_dirs = {p.rsplit("/", 1)[0] for p in wanted if "/" in p}
            target_dirs |= {d for p in list(target_dirs) for d in _ancestors(p)}
            for directory in sorted(scan.dirs, reverse=True):
                if directory not in target_dirs:
                    writer.remove_empty_dir(directory)
            for path in sorted(wanted):
                mode, oid = wanted[path]
                link = mode == MODE_LINK
                data = fetched[oid] if not link and oid in fetched else blobs.read(oid)
                writer.remove(path)  # whatever appeared there since the scan
                if link:
                    st = writer.symlink(path, data.decode("utf-8", "surrogateescape"))
                else:
                    st = writer.write_file(path, (data,), mode == MODE_EXEC)
                # Untrusted: written just now, a change in the same tick would look the same.
                result[path] = Entry(mode, oid, len(data), *stamp(st))
        return result, sorted(kept)

    def _summary(
        self,
        turn: int,
        commit: str,
        parent: str | None,
        changes: _Changes,
        scan: ScanResult,
    ) -> SnapshotSummary:
        added_lines = removed_lines = 0
        if changes.any():
            args = ["diff-tree", "-r", "--numstat", "-z", "--no-renames", "--no-textconv"]
            args += [parent, commit] if parent else ["--root", commit]
            for record in self._git(args).split(b"\0"):
                fields = record.split(b"\t")
                if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
                    added_lines += int(fields[0])
                    removed_lines += int(fields[1])
        return SnapshotSummary(
            turn=turn,
            snapshot=commit,
            added=tuple(changes.added),
            modified=tuple(changes.modified),
            deleted=tuple(changes.deleted),
            lines_added=added_lines,
            lines_removed=removed_lines,
            large=tuple(sorted(scan.large)),
            skipped=tuple(sorted(scan.skipped)),
            complete=scan.complete,
            note=scan.note,
        )


class _Importer:
    """A :class:`FastImport` started on first use (an unchanged snapshot needs none)."""

    def __init__(self, git_dir: Path, home: Path) -> None:
        self.git_dir, self.home = git_dir, home
        self.proc: FastImport | None = None

    @property
    def started(self) -> bool:
        return self.proc is not None

    def start(self) -> FastImport:
        if self.proc is None:
            self.proc = FastImport(self.git_dir, self.home)
        return self.proc

    def blob(self, oid: str, data: bytes) -> None:
        self.start().blob(oid, data)

    def abort(self) -> None:
        if self.proc is not None:
            self.proc.abort()


def _file_key(file: Path | int) -> tuple[int, int, int, int]:
    st = os.stat(file)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _restored_record(scan: ScanResult, current: dict[str, Entry]) -> Record | None:
    """The record of the workspace a restore left: the scan's directories (one it created or
    removed left a directory event: the watch is broken) and ``current``; the directories of
    the skipped entries it removed are rescanned."""
    large = [p for p, e in current.items() if e.large]
    total = sum(len(placeholder("0" * 64, e.size)) if e.large else e.size for e in current.values())
    record = Record.of(ScanResult(current, scan.dirs, large, [], total=total))
    if record is None:
        return None
    gone = {p.rpartition("/")[0] for p in scan.skipped}
    return replace(record, untrusted=record.untrusted | gone)


@dataclass(frozen=True)
class _Changes:
    added: list[str]
    modified: list[str]
    deleted: list[str]

    @classmethod
    def between(
        cls,
        previous: Mapping[str, Entry],
        current: Mapping[str, Entry],
        touched: list[str] | None = None,
    ) -> _Changes:
        """What differs (mode or blob) between the two manifests; only among ``touched``
        when given (the other paths are the same entries)."""
        if touched is not None:
            added, modified, deleted = [], [], []
            for path in set(touched):
                old, new = previous.get(path), current.get(path)
                if old is None:
                    if new is not None:
                        added.append(path)
                elif new is None:
                    deleted.append(path)
                elif (old.mode, old.blob) != (new.mode, new.blob):
                    modified.append(path)
            return cls(sorted(added), sorted(modified), sorted(deleted))
        added, modified = [], []
        for path, entry in current.items():
            old = previous.get(path)
            if old is None:
                added.append(path)
            elif (old.mode, old.blob) != (entry.mode, entry.blob):
                modified.append(path)
        deleted = [p for p in previous if p not in current]
        return cls(sorted(added), sorted(modified), sorted(deleted))

    def any(self) -> bool:
        return bool(self.added or self.modified or self.deleted)


def _ancestors(directory: str) -> list[str]:
    parts = directory.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _with_rewind(summary: SnapshotSummary, turn: int) -> SnapshotSummary:
    return replace(summary, rewound_to=turn)


def _branch(name: str, home: Path) -> str:
    """A branch name git accepts and that cannot be read as an option or a refspec."""
    if name.startswith("-") or ":" in name:
        raise SnapshotError(f"invalid branch name {name!r}")
    try:
        run_git(None, ["check-ref-format", "--branch", name], home=home, timeout_s=10)
    except GitError as exc:
        raise SnapshotError(f"invalid branch name {name!r}") from exc
    return name


@functools.lru_cache(maxsize=8)
def _template_of(template: str) -> tuple[tuple[str, ...], tuple[tuple[str, bytes], ...]]:
    """The stores' template as this process writes it: its folders (parents first) and its
    files with their bytes. Read once: the template never changes once made."""
    folders: list[str] = []
    files: list[tuple[str, bytes]] = []
    for here, subfolders, names in os.walk(template):
        relative = os.path.relpath(here, template)
        prefix = "" if relative == "." else relative + os.sep
        subfolders.sort()
        folders.extend(prefix + name for name in subfolders)
        files.extend((prefix + name, Path(here, name).read_bytes()) for name in sorted(names))
    return tuple(folders), tuple(files)
