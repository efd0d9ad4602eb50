"""Writing into and removing from a workspace an agent controls, without ever following a link.

The worker runs as root; the agent can replace any directory of its workspace with a symlink
to ``/etc`` at any moment, even while the worker is writing. So every operation here is
relative to a directory file descriptor opened with ``O_NOFOLLOW``, one component at a time:
a component that became a symlink fails to open (``ELOOP``/``ENOTDIR``) instead of being
followed, files are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (never truncating whatever is
there) and ownership is set on the descriptor (``fchown``) or without following
(``follow_symlinks=False``). A Unix socket is bound through ``/proc/self/fd`` of its
directory's descriptor and given its mode through an ``O_PATH|O_NOFOLLOW`` descriptor of
itself. A failure raises :class:`UnsafePath` (an :class:`OSError` translated at this seam),
never writes elsewhere.

Paths are relative, ``/``-separated strings (``os.fsdecode`` of bytes: names that are not
UTF-8 round-trip through surrogate escapes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
from collections.abc import Iterable
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


def open_dir(root: Path, reldir: str) -> int:
    """The descriptor of the directory ``reldir`` under ``root``, opened one component at a
    time: a component that is a link (or no directory) is refused, never followed."""
    names = split(reldir)
    fd = open_root(root)
    try:
        for name in names:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as exc:
        os.close(fd)
        raise UnsafePath(f"cannot open directory {reldir!r} of {root}: {exc.strerror}") from exc
    return fd


OWN_DIRECTORY_TRIES = 3


def own_directory(parent: int, name: str, mode: int) -> tuple[int, list[str]]:
    """``name`` in ``parent`` as a directory of this process's own, open: its descriptor (the
    caller closes it), and what was found at the name instead and put out of the way.

    A directory of this process's user that no one else may write to is kept as it is: nothing
    but this user can have changed what is in it. A missing one is made. Anything else is never
    followed: a non-directory (a symlink, a file) is unlinked; a directory of someone else's is
    renamed to ``NAME.moved-HEX`` beside it, with whatever is in it, none of which is read.
    Every decision is taken on the descriptor opened (``fstat``), not on an earlier look at
    the name; the mode is set on it too. :class:`UnsafePath` when the name keeps changing
    under these steps (something is racing them) or cannot be made.
    """
    split(name)
    displaced: list[str] = []
    for _ in range(OWN_DIRECTORY_TRIES):
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            except OSError as exc:
                raise UnsafePath(f"cannot make directory {name!r}: {exc.strerror}") from exc
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath(f"cannot open directory {name!r}: {exc.strerror}") from exc
            displaced.extend(_unlink_non_directory(parent, name))
            continue
        found = os.fstat(fd)
        if found.st_uid == os.geteuid() and not found.st_mode & 0o022:
            try:
                os.fchmod(fd, mode)
            except OSError as exc:
                os.close(fd)
                raise UnsafePath(f"cannot set the mode of {name!r}: {exc.strerror}") from exc
            return fd, displaced
        os.close(fd)
        aside = f"{name}.moved-{secrets.token_hex(4)}"
        try:
            os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UnsafePath(f"cannot move {name!r} out of the way: {exc.strerror}") from exc
        displaced.append(f"a directory of uid {found.st_uid}, moved to {aside}")
    raise UnsafePath(f"{name!r} kept changing while it was made: something else is replacing it")


def _unlink_non_directory(parent: int, name: str) -> list[str]:
    """Unlink ``name`` unless it is (by now) a directory; what it was, if it was unlinked."""
    try:
        kind = stat.S_IFMT(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        if kind == stat.S_IFDIR:
            return []
        os.unlink(name, dir_fd=parent)
    except (FileNotFoundError, IsADirectoryError):
        return []
    except OSError as exc:
        raise UnsafePath(f"cannot remove {name!r}: {exc.strerror}") from exc
    return [KINDS.get(kind, "a special file")]


KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFREG: "a file", stat.S_IFSOCK: "a socket"}


def put_file(directory: int, name: str, data: bytes, mode: int) -> None:
    """Write ``name`` anew in the directory open as ``directory`` (what was at the name is
    unlinked, never followed): ``data``, with ``mode`` set on the descriptor."""
    split(name)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=directory)
        fd = os.open(name, CREATE_FLAGS, 0o600, dir_fd=directory)
    except OSError as exc:
        raise UnsafePath(f"cannot create {name!r}: {exc.strerror}") from exc
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    except OSError as exc:
        raise UnsafePath(f"cannot write {name!r}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def bind_socket(directory: int, name: str, mode: int) -> socket.socket:
    """A Unix stream socket bound anew at ``name`` in the directory open as ``directory``
    (what was at the name is unlinked, never followed), its file given ``mode``. Not yet
    listening; the caller closes it, and unlinks the name (:func:`unlink`)."""
    split(name)
    with contextlib.suppress(FileNotFoundError):
        unlink(directory, name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Through the directory's descriptor: whatever the directory's path now is, and
        # whatever its length (a socket address holds at most 107 bytes).
        listener.bind(f"/proc/self/fd/{directory}/{name}")
        _chmod_socket(directory, name, mode)
    except (OSError, UnsafePath) as exc:
        listener.close()
        with contextlib.suppress(OSError, UnsafePath):
            unlink(directory, name)
        if isinstance(exc, UnsafePath):
            raise
        raise UnsafePath(f"cannot bind the socket {name!r}: {exc.strerror}") from exc
    return listener


def _chmod_socket(directory: int, name: str, mode: int) -> None:
    """chmod follows a link and fchmod on a socket reaches no file: the name is opened as a
    path only (``O_PATH|O_NOFOLLOW``, which opens a link itself), checked to be a socket on
    that descriptor, and the mode set through the descriptor's ``/proc`` entry, which names
    that very inode."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise UnsafePath(f"{name!r} is no longer the socket just bound: its mode is not set")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def unlink(directory: int, name: str) -> None:
    """Unlink ``name`` (never a directory) in the directory open as ``directory``; a link is
    removed itself. ``FileNotFoundError`` when nothing is there."""
    split(name)
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnsafePath(f"cannot remove {name!r}: {exc.strerror}") from exc
