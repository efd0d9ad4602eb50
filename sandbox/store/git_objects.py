"""Reading and writing objects of a worker-owned bare repository with long-lived git processes.

:class:`BlobReader` wraps one ``git cat-file --batch`` (one process for any number of blobs);
:class:`FastImport` wraps one ``git fast-import`` that writes a snapshot's new blobs and its
commit in a single pass; :func:`ls_tree` lists a commit's tree. All run through
:mod:`sandbox.store.git_run`, hardened, against the store only.

:func:`write_commit` and :func:`write_ref` write a commit whose tree the store already holds,
and a ref, without a process, in git's own formats (a zlib-compressed loose object; a ref file
holding the id, renamed into place from ``<ref>.lock`` when new, overwritten when it moves):
the store is a bare repository only the worker writes, under its lock, with no packed refs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple

from sandbox.base import GitError
from sandbox.small_files import rewrite_in_place
from sandbox.store.git_run import popen_git, run_git


class TreeEntry(NamedTuple):
    mode: str
    oid: str
    size: int


def ls_tree(git_dir: Path, commit: str, home: Path, timeout_s: float) -> dict[str, TreeEntry]:
    """Every blob and symlink of ``commit``'s tree by path (gitlinks left out)."""
    out = run_git(
        git_dir, ["ls-tree", "-r", "-z", "-l", "--full-tree", commit], home=home,
        timeout_s=timeout_s,
    )  # fmt: skip
    entries: dict[str, TreeEntry] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, oid, size = meta.split()
        if kind != b"blob":
            continue
        entries[raw_path.decode("utf-8", "surrogateescape")] = TreeEntry(
            mode.decode(), oid.decode(), int(size)
        )
    return entries


class BlobReader:
    """Blobs by id from one ``git cat-file --batch``; a context manager that kills it on exit."""

    def __init__(self, git_dir: Path, home: Path) -> None:
        self.proc = popen_git(git_dir, ["cat-file", "--batch"], home=home, stdin=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def read(self, oid: str) -> bytes:
        self._in.write(oid.encode() + b"\n")
        self._in.flush()
        header = self._out.readline()
        parts = header.split()
        if len(parts) != 3:
            raise GitError(f"object {oid} is missing from the store")
        size = int(parts[2])
        data = self._out.read(size)
        self._out.read(1)  # the newline after the contents
        if len(data) != size:
            raise GitError(f"object {oid} was cut short")
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._in.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def read_blobs(git_dir: Path, home: Path, oids: Sequence[str]) -> Iterator[bytes]:
    """The contents of ``oids``, in order, from one ``git cat-file --batch --buffer`` fed by a
    thread: no round trip per object (thousands of small blobs cost a pipe wait each)."""
    proc = popen_git(git_dir, ["cat-file", "--batch", "--buffer"], home=home, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def feed() -> None:
        with contextlib.suppress(OSError, ValueError):  # the reader gave up: cat-file killed
            for start in range(0, len(oids), 1024):
                stdin.write("".join(oid + "\n" for oid in oids[start : start + 1024]).encode())
            stdin.close()

    feeder = threading.Thread(target=feed, name="cat-file-feed", daemon=True)
    feeder.start()
    try:
        for oid in oids:
            parts = stdout.readline().split()
            if len(parts) != 3 or parts[1] == b"missing":
                raise GitError(f"object {oid} is missing from the store")
            size = int(parts[2])
            data = stdout.read(size)
            stdout.read(1)  # the newline after the contents
            if len(data) != size:
                raise GitError(f"object {oid} was cut short")
            yield data
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        feeder.join()
        for pipe in (stdin, stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def quote_path(path: str) -> bytes:
    """A path as fast-import reads it: C-quoted when it holds a newline or starts with a quote."""
    raw = path.encode("utf-8", "surrogateescape")
    if b"\n" not in raw and not raw.startswith(b'"'):
        return raw
    out = bytearray(b'"')
    for byte in raw:
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif byte < 0x20 or byte == 0x7F:
            out += b"\\%03o" % byte
        else:
            out.append(byte)
    return bytes(out + b'"')


def identity(when: int) -> bytes:
    return b"harness-worker <harness-worker@localhost> %d +0000" % when


def write_commit(git_dir: Path, tree: str, parent: str | None, message: str, when: int) -> str:
    """Write the commit object (as :class:`FastImport` would: same header, message verbatim)
    and return its id."""
    who = identity(when)
    body = b"tree %s\n" % tree.encode()
    if parent is not None:
        body += b"parent %s\n" % parent.encode()
    body += b"author %s\ncommitter %s\n\n" % (who, who)
    body += message.encode("utf-8", "surrogateescape")
    return write_object(git_dir, b"commit", body)


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""The id of the tree with no entries (git's own constant)."""


def write_object(git_dir: Path, kind: bytes, body: bytes) -> str:
    """Write a loose object (``kind``: commit, tree, blob) unless the store has it; its id."""
    data = b"%s %d\0" % (kind, len(body)) + body
    oid = hashlib.sha1(data, usedforsecurity=False).hexdigest()
    folder = git_dir / "objects" / oid[:2]
    target = folder / oid[2:]
    if not target.exists():
        folder.mkdir(exist_ok=True)
        _write_replace(folder / f"tmp_obj_{oid[2:]}", target, zlib.compress(data, 1), 0o444)
    return oid


def write_ref(git_dir: Path, ref: str, oid: str) -> None:
    """Point the loose ref ``ref`` (``refs/...``) at ``oid``: a new ref renamed into place from
    its lock file, an existing one (the tip, moved every turn) overwritten in place."""
    target = git_dir / ref
    data = oid.encode() + b"\n"
    if rewrite_in_place(target, data, create=False):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_replace(target.with_name(target.name + ".lock"), target, data, 0o644)


def _write_replace(temporary: Path, target: Path, data: bytes, mode: int) -> None:
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, target)


class FastImport:
    """One ``git fast-import --done``: blobs first (marked), then one commit.

    The stream ends with ``done``, so a worker that dies mid-stream leaves no half commit.
    """

    def __init__(self, git_dir: Path, home: Path) -> None:
        self.proc = popen_git(
            git_dir,
            ["fast-import", "--quiet", "--force", "--done", "--date-format=raw"],
            home=home,
            stdin=subprocess.PIPE,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout
        self._marks: dict[str, int] = {}
        self._next = 1
        self.tree = ""
        """The tree of the commit written, once :meth:`commit` returned."""

    def blob(self, oid: str, data: bytes) -> None:
        if oid in self._marks:
            return
        mark = self._next
        self._next += 1
        self._marks[oid] = mark
        self._in.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
        self._in.write(data)
        self._in.write(b"\n")

    def commit(
        self,
        ref: str,
        message: str,
        parent: str | None,
        deletes: Iterable[str],
        modifies: Iterable[tuple[str, str, str]],
        when: int,
        extra_refs: Iterable[str] = (),
    ) -> str:
        """Write the commit (``modifies``: path, mode, blob id) and return its id."""
        mark = self._next
        self._next += 1
        who = identity(when)
        text = message.encode("utf-8", "surrogateescape")
        lines = [b"commit %s\nmark :%d\nauthor %s\ncommitter %s\n" % (ref.encode(), mark, who, who)]
        lines.append(b"data %d\n%s\n" % (len(text), text))
        if parent is not None:
            lines.append(b"from %s\n" % parent.encode())
        lines.extend(b"D %s\n" % quote_path(p) for p in deletes)
        for path, mode, oid in modifies:
            known = self._marks.get(oid)
            ref_text = b":%d" % known if known is not None else oid.encode()
            lines.append(b"M %s %s %s\n" % (mode.encode(), ref_text, quote_path(path)))
        lines.append(b"\n")
        lines.extend(b"reset %s\nfrom :%d\n\n" % (r.encode(), mark) for r in extra_refs)
        lines.append(b'get-mark :%d\nls :%d ""\n' % (mark, mark))
        self._in.write(b"".join(lines))
        self._in.flush()
        answer = self._out.readline().strip()
        listing = self._out.readline().split()
        if len(answer) != 40:
            self.abort()
            raise GitError(f"fast-import did not write the commit: {self._stderr()}")
        if len(listing) >= 3 and listing[1] == b"tree" and len(listing[2]) == 40:
            self.tree = listing[2].decode()
        self._in.write(b"done\n")
        self._in.close()
        if self.proc.wait(timeout=120) != 0:
            raise GitError(f"fast-import failed: {self._stderr()}")
        self._close_pipes()
        return answer.decode()

    def finish(self) -> None:
        """End a stream of blobs only (no commit): they are written, no ref moves."""
        self._in.write(b"done\n")
        self._in.close()
        if self.proc.wait(timeout=120) != 0:
            raise GitError(f"fast-import failed: {self._stderr()}")
        self._close_pipes()

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        try:
            return self.proc.stderr.read().decode("utf-8", "replace")[-800:]
        except (OSError, ValueError):
            return ""

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def abort(self) -> None:
        """Stop without committing (no ``done``: fast-import updates no ref)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()
