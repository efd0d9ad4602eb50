"""A snapshot's tree as a tar.gz, written from the store's objects in Python.

Not ``git archive``: that would read ``export-subst``/``export-ignore`` rules from the tree and
the store's config. Each regular file keeps its mode (0644 or 0755), each symlink is a symlink
(its target text, never what it points to), directories are implied and written once, owner
0:0, every date the snapshot's commit date.

A file above the snapshot's ``max_file_bytes`` was never kept: the archive holds its
placeholder text (``harness-large-file sha256=<hex> size=<n>``) at its path, and a listing
``.harness-omitted`` at the root (one ``<sha256> <size> <path>`` line per file) says so; when
the tree already has a ``.harness-omitted``, the listing takes the first free name
``.harness-omitted.<n>``.

The common member (an ASCII name that fits a ustar header) gets a header built here; any
other goes through :mod:`tarfile` (a pax header). Blobs stream from one ``cat-file`` without a
round trip each, and the gzip level is 6, as ``tar -z`` uses: level 9 costs twice the time
for a few percent.
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from sandbox.store.git_objects import TreeEntry, read_blobs
from sandbox.store.scan import MODE_EXEC, MODE_LINK, parse_placeholder

OMITTED = ".harness-omitted"
GZIP_LEVEL = 6
FLUSH_BYTES = 1 << 20
BLOCK = 512


class _GzipOut:
    """Gzip-compresses into ``out`` in large pieces and counts the compressed bytes."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.count = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.zlib = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: a gzip wrapper

    def write(self, data: bytes) -> None:
        self.pending.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes >= FLUSH_BYTES:
            self._emit(self.zlib.compress(b"".join(self.pending)))

    def close(self) -> None:
        self._emit(self.zlib.compress(b"".join(self.pending)) + self.zlib.flush())

    def _emit(self, data: bytes) -> None:
        self.pending.clear()
        self.pending_bytes = 0
        if data:
            self.out.write(data)
            self.count += len(data)


def write_tar_gz(
    tree: Mapping[str, TreeEntry], git_dir: Path, home: Path, out: BinaryIO, mtime: int
) -> int:
    """Write ``tree`` as a tar.gz to ``out``; the compressed bytes written."""
    gz = _GzipOut(out)
    omitted: list[str] = []
    made: set[str] = set()
    paths = sorted(tree)
    blobs = read_blobs(git_dir, home, [tree[p].oid for p in paths])
    for path, data in zip(paths, blobs, strict=True):
        entry = tree[path]
        _parents(gz, path, made, mtime)
        if entry.mode == MODE_LINK:
            gz.write(_header(path, tarfile.SYMTYPE, 0o777, 0, mtime, _link_text(data)))
            continue
        mode = 0o755 if entry.mode == MODE_EXEC else 0o644
        gz.write(_header(path, tarfile.REGTYPE, mode, len(data), mtime))
        gz.write(data)
        if len(data) % BLOCK:
            gz.write(bytes(BLOCK - len(data) % BLOCK))
        large = parse_placeholder(data) if len(data) < 200 else None
        if large is not None:
            omitted.append(f"{large[0]} {large[1]} {path}\n")
    if omitted:
        name = OMITTED
        n = 0
        while name in tree:
            n += 1
            name = f"{OMITTED}.{n}"
        listing = "".join(omitted).encode("utf-8", "surrogateescape")
        gz.write(_header(name, tarfile.REGTYPE, 0o644, len(listing), mtime))
        gz.write(listing + bytes(-len(listing) % BLOCK))
    gz.write(bytes(2 * BLOCK))  # the end-of-archive marker
    gz.close()
    return gz.count


def _link_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _header(name: str, kind: bytes, mode: int, size: int, mtime: int, linkname: str = "") -> bytes:
    raw_name, raw_link = name.encode("ascii", "replace"), linkname.encode("ascii", "replace")
    if (
        len(raw_name) > 100
        or len(raw_link) > 100
        or not (name.isascii() and linkname.isascii())
        or size >= 0o77777777777
    ):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.size, info.mtime = kind, mode, size, mtime
        info.linkname = linkname
        info.uname = info.gname = "root"
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    header = b"".join((
        raw_name.ljust(100, b"\0"),
        b"%07o\0" % mode,
        b"0000000\0" * 2,  # uid, gid
        b"%011o\0" % size,
        b"%011o\0" % mtime,
        b" " * 8,  # the checksum, counted as spaces
        kind,
        raw_link.ljust(100, b"\0"),
        b"ustar\x0000",
        b"root".ljust(32, b"\0") * 2,  # uname, gname
        b"0000000\0" * 2,  # devmajor, devminor
        bytes(167),  # prefix and padding
    ))  # fmt: skip
    checksum = b"%06o\0 " % sum(header)
    return header[:148] + checksum + header[156:]


def _parents(gz: _GzipOut, path: str, made: set[str], mtime: int) -> None:
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        directory = "/".join(parts[:i])
        if directory in made:
            continue
        made.add(directory)
        gz.write(_header(directory, tarfile.DIRTYPE, 0o755, 0, mtime))
