"""What this process knows about a store's workspace between two snapshots: an inotify watch of
every directory the last full walk visited, the directories changed since, and the record that
walk (or the rescans after it) left.

**One inotify instance per process** (``fs.inotify.max_user_instances`` defaults to 128), read
by a daemon thread that folds each event into the dirty set of the store owning the watch; a
snapshot drains the descriptor under the same lock first, so every event queued before it
began is counted (the kernel queues an event inside the system call that caused it). A watch is
added through the directory descriptor the scanner already holds (``/proc/self/fd/<n>``: the
kernel resolves that magic link to the open directory itself, so no path is looked up again and
a directory swapped for a link meanwhile cannot redirect it). ``IN_DONT_FOLLOW`` cannot be
used with that form: it would watch the ``/proc`` link itself (``ENOTDIR`` with
``IN_ONLYDIR``). Watches are added before a directory is listed, so a change after the listing
always leaves an event.

**Trust.** A :class:`Watch` covers a commit: "in place, unbroken, since before the scan that
produced it". It is broken (the next snapshot walks the whole tree and starts again) by
anything that is not a plain change of a file or link: an event about a directory
(``IN_ISDIR``: created, deleted, renamed, its attributes), a watched directory deleted, moved
or unmounted (``IN_DELETE_SELF``, ``IN_MOVE_SELF``, ``IN_IGNORED``, ``IN_UNMOUNT``), a queue
overflow, more than :data:`MAX_DIRTY` dirty directories, a watch that could not be added (no
inotify, ``ENOSPC``, :data:`MAX_WATCHES` reached, a directory already watched for another
store). Nothing here ever fails a snapshot: without a usable watch it is a full walk.

**Limits.** Writes through a shared ``mmap`` raise no inotify event (the kernel reports
``write()``-family calls, truncation, attribute changes and the close of a writable
descriptor; a page dirtied through a mapping after that close is invisible). git's own
fsmonitor accepts the same. So does a write through a hard link whose other name is under an
ignored path (``/.home``, a ``.git``), never watched: no event reaches the directory of the
workspace's name (a directory holding a file with more than one link that the walk saw is
rescanned every time, see :class:`sandbox.store.scan.Record`). Every
:data:`FULL_WALK_EVERY`-th snapshot of a store walks the whole tree anyway, so such a change is
recorded at most that many snapshots late. Memory is
bounded: at most :data:`MAX_STORES` stores are remembered (least recently used dropped, its
watches removed), and dirty sets are capped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK
)  # fmt: skip
_STRUCTURAL = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT

MAX_STORES = 64
"""Stores remembered per process (a worker runs up to 64 at once); each holds its manifest."""
MAX_WATCHES = 4096
"""Directories watched per store; a bigger tree is walked whole every time."""
MAX_PROCESS_WATCHES = 32768
"""Watches of the whole process: ``fs.inotify.max_user_watches`` is shared by every process of
the user (root, for the worker: dockerd and systemd too), so the worker keeps well below it."""
MAX_DIRTY = 1024
"""Dirty directories kept per store; past that a full walk is cheaper than the rescans."""
FULL_WALK_EVERY = 16
"""Every this many snapshots of a store, one walks the whole tree (what the watch cannot see,
writes through a shared mmap, is then recorded)."""

_EVENT = struct.Struct("iIII")


@dataclass
class Watch:
    """One store's watch and what the process remembers of it. Fields other than the
    inotify state are the snapshot code's, read and written under the store's lock."""

    key: str
    covers: str | None = None
    """The commit this watch (and :attr:`record`) has been valid for since its full walk."""
    record: Any = None
    """What the snapshot code keeps to rescan incrementally (its type is the caller's)."""
    manifest: Any = None
    """The caller's in-memory copy of the store's manifest file, with what validates it."""
    trees: dict[str, str] = field(default_factory=dict)
    """Commit -> tree id, for commits this process wrote or read (a few, newest last)."""
    since_full: int = 0
    """Snapshots taken by rescanning since the last full walk."""
    _wds: dict[int, str] = field(default_factory=dict)
    _stale: list[int] = field(default_factory=list)
    _dirty: set[str] = field(default_factory=set)
    _broken: str = "no full walk yet"
    _ignored: Callable[[str, str], bool] | None = None

    def begin(self, ignored: Callable[[str, str], bool]) -> None:
        """A full walk starts: forget every event so far; the walk adds its watches with
        :meth:`add` and ends with :meth:`end`."""
        _hub().begin(self, ignored)

    def add(self, fd: int, path: str) -> None:
        """Watch the directory open as ``fd`` (the workspace-relative ``path``) before it is
        listed; on any failure the watch is broken, the walk goes on."""
        _hub().add(self, fd, path)

    def end(self) -> None:
        """The walk is over: watches of directories it did not visit again are removed."""
        _hub().end(self)

    def drain(self) -> tuple[set[str], str]:
        """(directories changed since the last drain or walk, why the watch is broken or "")
        after reading every queued event; the dirty set starts again empty."""
        return _hub().drain(self)

    def remember_tree(self, commit: str, tree: str) -> None:
        self.trees[commit] = tree
        while len(self.trees) > 4:
            del self.trees[next(iter(self.trees))]


def watch_of(key: str) -> Watch:
    """The process's watch of the store at ``key`` (created empty, broken, if need be)."""
    return _hub().watch_of(key)


def forget(key: str) -> None:
    """Drop what the process remembers of the store at ``key`` and remove its watches."""
    _hub().forget(key)


class _Inotify:
    """The inotify instance and the wd -> (watch, directory) map, guarded by one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watches: OrderedDict[str, Watch] = OrderedDict()
        self.owners: dict[int, tuple[Watch, str]] = {}
        self.fd = -1
        self.unavailable = ""
        self._libc: Any = None
        self._thread: threading.Thread | None = None

    # -- registry ----------------------------------------------------------------------

    def watch_of(self, key: str) -> Watch:
        with self.lock:
            watch = self.watches.get(key)
            if watch is not None:
                self.watches.move_to_end(key)
                return watch
            watch = Watch(key)
            self.watches[key] = watch
            while len(self.watches) > MAX_STORES:
                _, old = self.watches.popitem(last=False)
                self._release(old, "dropped (too many stores)")
            return watch

    def forget(self, key: str) -> None:
        with self.lock:
            watch = self.watches.pop(key, None)
            if watch is not None:
                self._release(watch, "forgotten")

    def _release(self, watch: Watch, why: str) -> None:
        for wd in [*watch._wds, *watch._stale]:
            self._remove(watch, wd)
        watch._wds, watch._stale = {}, []
        watch._broken = why
        watch._dirty = set()
        watch.covers = None
        watch.record = watch.manifest = None

    def _unwatch(self, watch: Watch) -> None:
        for wd in watch._wds:
            self._remove(watch, wd)
        watch._wds = {}

    def _remove(self, watch: Watch, wd: int) -> None:
        owner = self.owners.get(wd)
        if owner is not None and owner[0] is watch:
            del self.owners[wd]
            if self.fd >= 0:
                self._libc.inotify_rm_watch(self.fd, wd)

    # -- a full walk ---------------------------------------------------------------------

    def begin(self, watch: Watch, ignored: Callable[[str, str], bool]) -> None:
        with self.lock:
            self._start()
            # Events on the old watches until a directory is watched again are from changes
            # before the walk lists it: dropped (the walk sees them).
            for wd in watch._wds:
                owner = self.owners.get(wd)
                if owner is not None and owner[0] is watch:
                    del self.owners[wd]
            watch._stale.extend(watch._wds)
            watch._wds = {}
            watch._dirty = set()
            watch._ignored = ignored
            watch._broken = self.unavailable
            if watch.key not in self.watches:
                watch._broken = "forgotten"

    def add(self, watch: Watch, fd: int, path: str) -> None:
        if watch._broken:
            return
        with self.lock:
            if watch._broken:
                return
            if len(watch._wds) >= MAX_WATCHES:
                watch._broken = f"more than {MAX_WATCHES} directories"
                return
            if len(self.owners) >= MAX_PROCESS_WATCHES:
                watch._broken = f"the process holds {MAX_PROCESS_WATCHES} watches"
                return
            wd = self._libc.inotify_add_watch(self.fd, b"/proc/self/fd/%d" % fd, MASK)
            if wd < 0:
                watch._broken = f"cannot watch: {os.strerror(ctypes.get_errno())}"
                return
            owner = self.owners.get(wd)
            if owner is not None and owner[0] is not watch:
                # The same directory reached from two stores (a bind mount): neither is sure.
                owner[0]._broken = watch._broken = "a directory watched for two stores"
                return
            self.owners[wd] = (watch, path)
            watch._wds[wd] = path

    def end(self, watch: Watch) -> None:
        with self.lock:
            for wd in watch._stale:
                if wd not in watch._wds:
                    owner = self.owners.get(wd)
                    if owner is None and self.fd >= 0:
                        self._libc.inotify_rm_watch(self.fd, wd)
            watch._stale = []

    def drain(self, watch: Watch) -> tuple[set[str], str]:
        with self.lock:
            self._read()
            dirty, watch._dirty = watch._dirty, set()
            return dirty, watch._broken

    # -- events --------------------------------------------------------------------------

    def _start(self) -> None:
        if self.fd >= 0 or self.unavailable:
            return
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError) as exc:
            self.unavailable = f"no inotify: {exc}"
            return
        if fd < 0:
            self.unavailable = f"no inotify: {os.strerror(ctypes.get_errno())}"
            return
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self._libc, self.fd = libc, fd
        self._thread = threading.Thread(target=self._run, name="snapshot-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            with contextlib.suppress(InterruptedError):
                poller.poll()
            with self.lock:
                self._read()

    def _read(self) -> None:
        if self.fd < 0:
            return
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset, size = 0, len(data)
        owners = self.owners
        while offset + 16 <= size:
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + 16 : offset + 16 + length].rstrip(b"\0")
            offset += 16 + length
            if mask & IN_Q_OVERFLOW:
                for watch in self.watches.values():
                    watch._broken = "inotify queue overflow"
                    watch._dirty = set()
                    self._unwatch(watch)
                continue
            owner = owners.get(wd)
            if owner is None:
                continue
            watch, path = owner
            if watch._broken:
                continue
            # Once broken, the store's watches are removed: a turn that churns the tree (a
            # package install) costs no event handling until the next full walk adds them.
            if mask & _STRUCTURAL:
                watch._broken = f"directory /{path} deleted or moved"
            elif mask & IN_ISDIR:
                text = os.fsdecode(name)
                child = f"{path}/{text}" if path else text
                if text and watch._ignored is not None and watch._ignored(child, text):
                    continue
                watch._broken = f"directory /{child} changed"
            else:
                watch._dirty.add(path)
                if len(watch._dirty) <= MAX_DIRTY:
                    continue
                watch._broken = f"more than {MAX_DIRTY} directories changed"
            watch._dirty = set()
            self._unwatch(watch)


_HUB: _Inotify | None = None
_HUB_PID = 0
_HUB_LOCK = threading.Lock()


def _hub() -> _Inotify:
    global _HUB, _HUB_PID
    # A forked child has its parent's descriptor but not its thread: it starts its own.
    if _HUB is None or os.getpid() != _HUB_PID:
        with _HUB_LOCK:
            if _HUB is None or os.getpid() != _HUB_PID:
                if _HUB is not None and _HUB.fd >= 0:
                    os.close(_HUB.fd)  # the parent's instance: this process never reads it
                _HUB, _HUB_PID = _Inotify(), os.getpid()
    return _HUB
