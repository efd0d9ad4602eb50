"""Reading a workspace an agent controls into a manifest, race-safely and within bounds.

The walk goes through directory descriptors (``scandir`` on a descriptor, children opened with
``O_DIRECTORY|O_NOFOLLOW``), so a directory swapped for a symlink mid-walk is refused instead
of followed. A file is opened with ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK`` relative to its
directory, and only after its ``lstat`` said "regular file"; ``fstat`` on the descriptor
confirms it before a byte is read (a FIFO never blocks, a device is never read). Symlinks are
recorded as their target text, never followed; sockets, FIFOs and devices are listed as
skipped.

**Stat cache.** An entry whose (size, mtime, ctime, inode, type) match the previous manifest
keeps its blob id without being read. ctime cannot be set from inside a container, so a file
rewritten with a forged mtime still misses. An entry changed within :data:`RACY_NS` of being
stat'ed is marked untrusted (a second write in the same timestamp tick would look unchanged)
and is read again next time.

**Ignore rules.** :data:`DEFAULT_IGNORE` plus the caller's patterns, matched with ``fnmatch``:
a pattern starting with ``/`` matches the path from the workspace root (``/.home``,
``/build/*.o``); any other pattern matches a single name at any depth (``.git``,
``node_modules``, ``*.pyc``). An ignored directory is not entered.

**Large files** (above ``max_file_bytes``) are hashed with SHA-256 while streaming and recorded
as a placeholder blob, ``harness-large-file sha256=<hex> size=<n>\\n``, unless the store
already holds their exact bytes (a large file of the seed repository, unchanged): then the
real blob is recorded, so turn 0 equals the seed and a push never replaces it.

**Bounds.** ``max_files``, ``max_total_bytes`` (the sum of the sizes recorded, a large file
counting its placeholder) and a deadline: the first one hit stops the walk; the result says
``complete=False`` and why, and the caller keeps the previous record of whatever was not
reached.

**Rescan.** With a :class:`Record` of a complete walk and the directories changed since (see
:mod:`sandbox.store.watch`), :meth:`Scanner.rescan` lists only those directories, without
descending, and keeps every other entry of the record; what it cannot be sure of (a directory
it cannot open component by component, a subdirectory that appeared, vanished or changed kind,
a bound reached) makes it answer None, and the caller walks the whole tree.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sandbox.store.safe_fs import DIR_FLAGS, READ_FLAGS, open_root, split

DEFAULT_IGNORE: tuple[str, ...] = ("/.home", ".git")
"""The harness's HOME (vendor sessions, never part of the work) and every git directory."""

RACY_NS = 50_000_000
"""50 ms: well above the kernel's timestamp tick (a jiffy, 1-10 ms)."""

MODE_FILE, MODE_EXEC, MODE_LINK = "100644", "100755", "120000"
CHUNK = 1 << 20
LARGE_PREFIX = b"harness-large-file sha256="
_PLACEHOLDER = re.compile(rb"\Aharness-large-file sha256=([0-9a-f]{64}) size=([0-9]+)\n\Z")


class Entry(NamedTuple):
    """One path of a manifest: what the store holds for it and the stat it was read with."""

    mode: str
    blob: str
    size: int = -1
    mtime_ns: int = -1
    ctime_ns: int = -1
    ino: int = -1
    large: bool = False
    trusted: bool = False

    def same_stat(self, st: os.stat_result) -> bool:
        # Tuple indexing: this runs once per file per snapshot.
        return self[7] and self[2:6] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def blob_id(data: bytes) -> str:
    """The id git gives a blob with these bytes (SHA-1 object format)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def placeholder(sha256: str, size: int) -> bytes:
    return b"harness-large-file sha256=%s size=%d\n" % (sha256.encode(), size)


def parse_placeholder(data: bytes) -> tuple[str, int] | None:
    """(sha256, size) when ``data`` is a large-file placeholder."""
    match = _PLACEHOLDER.match(data)
    return (match[1].decode(), int(match[2])) if match else None


class IgnoreRules:
    """Which workspace paths a snapshot never records and a restore never touches."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        patterns = (*DEFAULT_IGNORE, *extra)
        anchored = [p[1:] for p in patterns if p.startswith("/")]
        names = [p for p in patterns if not p.startswith("/")]
        self._exact_paths = frozenset(p for p in anchored if not _has_magic(p))
        self._glob_paths = tuple(p for p in anchored if _has_magic(p))
        self._exact_names = frozenset(p for p in names if not _has_magic(p))
        self._glob_names = tuple(p for p in names if _has_magic(p))

    def ignored(self, path: str, name: str) -> bool:
        if name in self._exact_names or path in self._exact_paths:
            return True
        if self._glob_names and any(fnmatch.fnmatchcase(name, p) for p in self._glob_names):
            return True
        return bool(self._glob_paths) and any(
            fnmatch.fnmatchcase(path, p) for p in self._glob_paths
        )

    def ignored_path(self, path: str) -> bool:
        """Whether ``path`` or any directory above it is ignored."""
        parts = path.split("/")
        return any(self.ignored("/".join(parts[: i + 1]), parts[i]) for i in range(len(parts)))


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


@dataclass
class ScanResult:
    entries: dict[str, Entry] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    large: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    complete: bool = True
    note: str = ""
    files_read: int = 0
    total: int = 0
    """The sum of the sizes recorded (what ``max_total_bytes`` bounds)."""
    opaque: bool = False
    """A directory could not be entered (its contents are unknown, not just skipped)."""
    linked: set[str] = field(default_factory=set)
    """Directories holding a file with more than one link: a write through another of its
    names (in another directory, or under an ignored path) leaves no event in this one."""


@dataclass
class Record:
    """What a complete walk (or a rescan after it) found, kept in memory to rescan only the
    directories that changed. Treated as immutable: :meth:`Scanner.rescan` builds a new one."""

    entries: dict[str, Entry]
    dirs: list[str]
    subdirs: dict[str, frozenset[str]]
    """Directory ("" the root) -> its child directories' paths."""
    names: dict[str, list[str]]
    """Directory -> the paths of its files and links."""
    large: frozenset[str]
    skipped: frozenset[str]
    untrusted: frozenset[str]
    """Directories rescanned every time: holding an entry read within the racy window, or a
    file with more than one link."""
    total: int
    linked: frozenset[str] = frozenset()
    """Directories holding a file with more than one link (a rescan finding another is
    unsure: the other names can be anywhere)."""

    @classmethod
    def of(cls, result: ScanResult) -> Record | None:
        """The record of a walk that read the whole tree, else None."""
        if not result.complete or result.opaque:
            return None
        subdirs: dict[str, set[str]] = {"": set()}
        for directory in result.dirs:
            subdirs.setdefault(directory, set())
            subdirs.setdefault(directory.rpartition("/")[0], set()).add(directory)
        names: dict[str, list[str]] = {d: [] for d in subdirs}
        untrusted = set(result.linked)
        for path, entry in result.entries.items():
            parent = path.rpartition("/")[0]
            siblings = names.get(parent)
            if siblings is None:
                return None  # an entry in a directory the walk did not list (a restore made it)
            siblings.append(path)
            if not entry[7]:
                untrusted.add(parent)
        return cls(
            result.entries, list(result.dirs), {d: frozenset(s) for d, s in subdirs.items()},
            names, frozenset(result.large), frozenset(result.skipped), frozenset(untrusted),
            result.total, frozenset(result.linked),
        )  # fmt: skip


class _Unsure(Exception):
    """A rescan cannot vouch for its result."""


BlobSink = Callable[[str, bytes], None]
"""Called with (blob id, bytes) for every blob the previous manifest does not hold."""


@dataclass(frozen=True)
class ScanBounds:
    max_file_bytes: int
    max_total_bytes: int
    max_files: int
    deadline: float
    """A ``time.monotonic()`` value."""


class _Stop(Exception):
    pass


class Scanner:
    """One walk of one workspace (see the module docstring)."""

    def __init__(
        self,
        previous: Mapping[str, Entry],
        bounds: ScanBounds,
        rules: IgnoreRules,
        sink: BlobSink,
        fresh: Mapping[str, Entry] = {},
        on_dir: Callable[[int, str], None] | None = None,
    ) -> None:
        """``fresh``: entries the worker itself wrote moments ago with nothing else writing
        (a seed), their blobs already in the store; a file whose stat still matches is taken
        as is, inside the racy window too, and kept trusted only if outside it.

        ``on_dir(fd, path)`` is called with every directory's descriptor before it is listed
        (``path`` "" for the root): where a watch is added."""
        self.fresh = fresh
        self.on_dir = on_dir
        self.recurse = True
        self.found_dirs: list[str] = []
        self.cache: Mapping[str, Entry] = previous
        if fresh:
            self.cache = {**previous, **{p: e._replace(trusted=True) for p, e in fresh.items()}}
        self.known_blobs = {e.blob for e in self.cache.values()}
        self.bounds = bounds
        self.rules = rules
        self.sink = sink
        self.result = ScanResult()
        self.total = 0
        self.started_ns = time.time_ns()

    def scan(self, root: Path) -> ScanResult:
        fd = open_root(root)
        try:
            self._walk(fd, "")
        except _Stop as stop:
            self.result.complete = False
            self.result.note = str(stop)
        finally:
            os.close(fd)
        self.result.total = self.total
        entries = self.result.entries
        for path, entry in self.fresh.items():
            if entries.get(path) is self.cache[path]:
                entries[path] = entry._replace(
                    trusted=max(entry.mtime_ns, entry.ctime_ns) + RACY_NS < self.started_ns
                )
        return self.result

    def _walk(self, fd: int, prefix: str) -> None:  # noqa: C901 (one inline hot loop)
        # The hot loop of every snapshot, once per file: the unchanged regular file is handled
        # inline with lookups hoisted (a method call per file costs as much as its lstat).
        if self.on_dir is not None:
            self.on_dir(fd, prefix[:-1])
        with os.scandir(fd) as it:
            children = sorted(it, key=_name)
        result = self.result
        entries = result.entries
        cached = self.cache.get
        ignored = self.rules.ignored
        bounds = self.bounds
        for child in children:
            name = child.name
            path = prefix + name
            if ignored(path, name):
                continue
            count = len(entries)
            if count >= bounds.max_files:
                raise _Stop(f"stopped at max_files={bounds.max_files}")
            if count & 255 == 0 and time.monotonic() > bounds.deadline:
                raise _Stop("stopped at the snapshot time limit")
            try:
                st = child.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFREG:
                if st.st_nlink > 1:
                    result.linked.add(prefix[:-1])
                old = cached(path)
                if (
                    old is not None
                    and old[7]  # trusted
                    and old[2] == st.st_size
                    and old[3] == st.st_mtime_ns
                    and old[4] == st.st_ctime_ns
                    and old[5] == st.st_ino
                    and old[0] == (MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE)
                ):
                    recorded = _placeholder_size(old[2]) if old[6] else old[2]
                    if self.total + recorded > bounds.max_total_bytes:
                        raise _Stop(f"stopped at max_total_bytes={bounds.max_total_bytes}")
                    self.total += recorded
                    entries[path] = old
                    if old[6]:
                        result.large.append(path)
                else:
                    self._file(fd, name, path, st)
            elif kind == stat.S_IFDIR:
                if not self.recurse:
                    self.found_dirs.append(path)
                    continue
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    result.skipped.append(path)  # swapped for a link, or gone
                    result.opaque = True
                    continue
                try:
                    result.dirs.append(path)
                    self._walk(sub, path + "/")
                finally:
                    os.close(sub)
            elif kind == stat.S_IFLNK:
                self._link(fd, name, path, st)
            else:
                result.skipped.append(path)

    def rescan(
        self, root: Path, record: Record, dirs: Iterable[str], max_files: int, max_bytes: int
    ) -> tuple[ScanResult, Record, list[str]] | None:
        """The whole tree's result from ``record`` with ``dirs`` listed again (not descended):
        (the result, the new record, every path whose entry may have changed); None when it
        could differ from a full walk's. The scanner's own bounds must not stop it: the whole
        tree's (``max_files``, ``max_bytes``) are checked here."""
        try:
            return self._rescan(root, record, dirs, max_files, max_bytes)
        except _Unsure:
            return None

    def _rescan(
        self, root: Path, record: Record, dirs: Iterable[str], max_files: int, max_bytes: int
    ) -> tuple[ScanResult, Record, list[str]]:
        self.recurse = False
        dirty = sorted(set(dirs) | record.untrusted)
        fd = open_root(root)
        try:
            for directory in dirty:
                known = record.subdirs.get(directory)
                if known is None:
                    raise _Unsure(f"/{directory} is not a directory the walk knows")
                sub = _open_dir(fd, directory) if directory else fd
                try:
                    self.found_dirs = []
                    self._walk(sub, directory + "/" if directory else "")
                finally:
                    if sub != fd:
                        os.close(sub)
                if frozenset(self.found_dirs) != known:
                    raise _Unsure(f"the subdirectories of /{directory} changed")
        except _Stop as stop:
            raise _Unsure(str(stop)) from None
        finally:
            os.close(fd)
        return self._merge(record, dirty, max_files, max_bytes)

    def _merge(
        self, record: Record, dirty: list[str], max_files: int, max_bytes: int
    ) -> tuple[ScanResult, Record, list[str]]:
        rescanned = set(dirty)
        entries = dict(record.entries)
        names = dict(record.names)
        large = set(record.large)
        untrusted = set(record.untrusted)
        total = record.total
        touched: list[str] = []
        for directory in dirty:
            for path in names[directory]:
                old = entries.pop(path)
                total -= _placeholder_size(old[2]) if old[6] else old[2]
                large.discard(path)
                touched.append(path)
            names[directory] = []
            untrusted.discard(directory)
        if not self.result.linked <= record.linked:
            raise _Unsure("a file with another link appeared")
        linked = (record.linked - rescanned) | self.result.linked
        untrusted.update(linked)
        for path, entry in self.result.entries.items():
            parent = path.rpartition("/")[0]
            names[parent].append(path)
            entries[path] = entry
            touched.append(path)
            if not entry[7]:
                untrusted.add(parent)
        total += self.total
        large.update(self.result.large)
        if len(entries) >= max_files or total > max_bytes:
            raise _Unsure("a bound of the snapshot is reached")
        skipped = {p for p in record.skipped if p.rpartition("/")[0] not in rescanned}
        skipped.update(self.result.skipped)
        result = ScanResult(
            entries, record.dirs, sorted(large), sorted(skipped),
            files_read=self.result.files_read, total=total,
        )  # fmt: skip
        new = Record(
            entries, record.dirs, record.subdirs, names, frozenset(large), frozenset(skipped),
            frozenset(untrusted), total, frozenset(linked),
        )  # fmt: skip
        return result, new, touched

    def _trusted(self, st: os.stat_result) -> bool:
        return max(st.st_mtime_ns, st.st_ctime_ns) + RACY_NS < self.started_ns

    def _record(self, path: str, entry: Entry, recorded_size: int) -> None:
        if self.total + recorded_size > self.bounds.max_total_bytes:
            raise _Stop(f"stopped at max_total_bytes={self.bounds.max_total_bytes}")
        self.total += recorded_size
        self.result.entries[path] = entry
        if entry.large:
            self.result.large.append(path)

    def _link(self, fd: int, name: str, path: str, st: os.stat_result) -> None:
        old = self.cache.get(path)
        if old is not None and old.mode == MODE_LINK and old.same_stat(st):
            self._record(path, old, old.size)
            return
        try:
            target = os.fsencode(os.readlink(name, dir_fd=fd))
        except OSError:
            self.result.skipped.append(path)
            return
        self._store(path, MODE_LINK, target, st, large=False)

    def _file(self, fd: int, name: str, path: str, st: os.stat_result) -> None:
        try:
            file_fd = os.open(name, READ_FLAGS, dir_fd=fd)
        except OSError:
            self.result.skipped.append(path)  # swapped for a link (ELOOP), or gone
            return
        try:
            st = os.fstat(file_fd)
            if not stat.S_ISREG(st.st_mode):
                self.result.skipped.append(path)
                return
            mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
            data = None
            if st.st_size <= self.bounds.max_file_bytes:
                data = _read_all(file_fd, self.bounds.max_file_bytes)
            if data is not None:
                self._store(path, mode, data, st, large=False)
                return
            # Too large to keep (or grew past the bound while read): its hash and size.
            digest, size, git_id = self._hash_large(file_fd, st.st_size)
            if git_id in self.known_blobs:
                # The store already holds these bytes (a seeded file): record the real blob.
                entry = Entry(mode, git_id, size, *stamp(st), False, self._trusted(st))
                self._record(path, entry, size)
            else:
                self._store(path, mode, placeholder(digest, size), st, large=True)
        finally:
            os.close(file_fd)

    def _hash_large(self, fd: int, expected: int) -> tuple[str, int, str]:
        """(SHA-256, size, git blob id if the size stayed ``expected``, else "")."""
        digest = hashlib.sha256()
        git = hashlib.sha1(b"blob %d\0" % expected, usedforsecurity=False)
        size = 0
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            git.update(chunk)
            size += len(chunk)
            if time.monotonic() > self.bounds.deadline:
                raise _Stop("stopped at the snapshot time limit")
        return digest.hexdigest(), size, git.hexdigest() if size == expected else ""

    def _store(self, path: str, mode: str, data: bytes, st: os.stat_result, large: bool) -> None:
        blob = blob_id(data)
        size = st.st_size if large else len(data)
        entry = Entry(mode, blob, size, *stamp(st), large, self._trusted(st))
        self._record(path, entry, len(data))
        self.result.files_read += 1
        if blob not in self.known_blobs:
            self.known_blobs.add(blob)
            self.sink(blob, data)


def _open_dir(root_fd: int, path: str) -> int:
    """``path`` under ``root_fd``, one ``O_NOFOLLOW`` component at a time; :class:`_Unsure`
    when any component is not a directory any more."""
    fd = root_fd
    try:
        for name in split(path):
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _Unsure(f"cannot open /{path}: {exc.strerror}") from None
            if fd != root_fd:
                os.close(fd)
            fd = sub
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise
    return fd


def _placeholder_size(size: int) -> int:
    return len(placeholder("0" * 64, size))


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _read_all(fd: int, limit: int) -> bytes | None:
    """The file's bytes, or None once more than ``limit`` were read."""
    parts: list[bytes] = []
    total = 0
    while chunk := os.read(fd, CHUNK):
        total += len(chunk)
        if total > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
