"""Writing into and removing from a workspace an agent controls, without ever following a link.

The worker runs as root; the agent can replace any directory of its workspace with a symlink
to ``/etc`` at any moment, even while the worker is writing. So every operation here is
relative to a directory file descriptor opened with ``O_NOFOLLOW``, one component at a time:
a component that became a symlink fails to open (``ELOOP``/``ENOTDIR``) instead of being
followed, files are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (never truncating whatever is
there) and ownership is set on the descriptor (``fchown``) or without following
(``follow_symlinks=False``). A failure raises :class:`UnsafePath` (an :class:`OSError`
translated at this seam), never writes elsewhere.

Paths are relative, ``/``-separated strings (``os.fsdecode`` of bytes: names that are not
UTF-8 round-trip through surrogate escapes).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from sandbox.base import UnsafePath

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def split(path: str) -> list[str]:
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"invalid relative path {path!r}")
    return parts


def open_root(root: Path) -> int:
    try:
        return os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise UnsafePath(f"cannot open the workspace {root}: {exc.strerror}") from exc


class SafeWriter:
    """Creates files, directories and symlinks under ``root``, owned by ``uid:gid``.

    Directory descriptors are cached for the writer's life, so writing a tree of thousands of
    files opens each directory once. Use as a context manager: the descriptors close on exit.
    ``created`` lists, in order, every path this writer created (directories included), so a
    caller can undo exactly that and nothing that was there before.
    """

    def __init__(self, root: Path, uid: int, gid: int) -> None:
        self.root = root
        self.uid = uid
        self.gid = gid
        self.created: list[str] = []
        self._chown = (uid, gid) != (os.geteuid(), os.getegid())
        self._dirs: dict[str, int] = {"": open_root(root)}

    def __enter__(self) -> SafeWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def _own(self, fd: int) -> None:
        if self._chown:
            # A worker that is not root cannot give files away; they stay the worker's.
            with contextlib.suppress(PermissionError):
                os.fchown(fd, self.uid, self.gid)

    def directory(self, reldir: str, *, create: bool = True) -> int:
        """The descriptor of ``reldir`` (``""`` is the root), creating missing components."""
        fd = self._dirs.get(reldir)
        if fd is not None:
            return fd
        parent_path, _, name = reldir.rpartition("/")
        split(name)
        parent = self.directory(parent_path, create=create)
        try:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                    created = True
                    self.created.append(reldir)
                except FileExistsError:
                    created = False
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise UnsafePath(f"cannot open directory {reldir!r}: {exc.strerror}") from exc
        if create and created:
            self._own(fd)
        self._dirs[reldir] = fd
        return fd

    def write_file(self, path: str, chunks: Iterable[bytes], executable: bool) -> os.stat_result:
        """Create ``path`` (it must not exist) with the chunks' bytes; its final ``fstat``."""
        parent_path, _, name = path.rpartition("/")
        split(path)
        parent = self.directory(parent_path)
        try:
            fd = os.open(name, CREATE_FLAGS, 0o600, dir_fd=parent)
        except OSError as exc:
            raise UnsafePath(f"cannot create {path!r}: {exc.strerror}") from exc
        self.created.append(path)
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o755 if executable else 0o644)
            self._own(fd)
            return os.fstat(fd)
        finally:
            os.close(fd)

    def symlink(self, path: str, target: str) -> os.stat_result:
        """Create the symlink ``path`` -> ``target`` (never followed); its ``lstat``."""
        parent_path, _, name = path.rpartition("/")
        split(path)
        parent = self.directory(parent_path)
        try:
            os.symlink(target, name, dir_fd=parent)
            self.created.append(path)
            if self._chown:
                with contextlib.suppress(PermissionError):
                    os.chown(name, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise UnsafePath(f"cannot create symlink {path!r}: {exc.strerror}") from exc

    def remove(self, path: str) -> None:
        """Remove ``path`` whatever it is (a directory with everything in it); absent is fine."""
        parent_path, _, name = path.rpartition("/")
        split(path)
        try:
            parent = self.directory(parent_path, create=False)
        except UnsafePath:
            return  # its parent is gone (or is no longer a directory): nothing of it is left
        self._forget(path)
        remove_entry(parent, name)

    def remove_empty_dir(self, path: str) -> bool:
        """Remove the directory ``path`` if it is empty; whether it was removed."""
        parent_path, _, name = path.rpartition("/")
        try:
            parent = self.directory(parent_path, create=False)
            self._forget(path)
            os.rmdir(name, dir_fd=parent)
        except (OSError, UnsafePath):
            return False
        return True

    def _forget(self, path: str) -> None:
        prefix = path + "/"
        for key in [k for k in self._dirs if k == path or k.startswith(prefix)]:
            os.close(self._dirs.pop(key))


def remove_entry(parent: int, name: str) -> None:
    """Remove ``name`` in the directory ``parent``: a non-directory is unlinked, a directory
    emptied through descriptors (never following a symlink) and removed."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafePath(f"cannot inspect {name!r}: {exc.strerror}") from exc
    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            for child in list_names(fd):
                remove_entry(fd, child)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafePath(f"cannot remove {name!r}: {exc.strerror}") from exc


def list_names(fd: int) -> list[str]:
    """The names in the directory open as ``fd`` (the descriptor stays usable)."""
    with os.scandir(fd) as entries:
        return [entry.name for entry in entries]


@contextlib.contextmanager
def opened_dir(parent: int, name: str) -> Iterator[int]:
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        yield fd
    finally:
        os.close(fd)
