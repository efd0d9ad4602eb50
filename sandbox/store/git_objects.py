"""Reading and writing objects of a worker-owned bare repository with long-lived git processes.

:class:`BlobReader` wraps one ``git cat-file --batch`` (one process for any number of blobs);
:class:`FastImport` wraps one ``git fast-import`` that writes a snapshot's new blobs and its
commit in a single pass; :func:`ls_tree` lists a commit's tree. All run through
:mod:`sandbox.store.git_run`, hardened, against the store only.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple

from sandbox.base import GitError
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
        who = b"harness-worker <harness-worker@localhost> %d +0000" % when
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
        lines.append(b"get-mark :%d\n" % mark)
        self._in.write(b"".join(lines))
        self._in.flush()
        answer = self._out.readline().strip()
        if len(answer) != 40:
            self.abort()
            raise GitError(f"fast-import did not write the commit: {self._stderr()}")
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
