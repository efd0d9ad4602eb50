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
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from typing import BinaryIO

from sandbox.git_objects import BlobReader, TreeEntry
from sandbox.workspace_scan import MODE_EXEC, MODE_LINK, parse_placeholder

OMITTED = ".harness-omitted"


class CountingWriter(io.RawIOBase):
    """Passes writes through to ``out`` and counts the bytes."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.out.write(data)
        self.count += len(data)
        return len(data)


def write_tar_gz(
    tree: Mapping[str, TreeEntry], blobs: BlobReader, out: BinaryIO, mtime: int
) -> int:
    """Write ``tree`` as a tar.gz to ``out``; the compressed bytes written."""
    counter = CountingWriter(out)
    omitted: list[str] = []
    with tarfile.open(fileobj=counter, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for path in sorted(tree):
            entry = tree[path]
            _parents(tar, path, made, mtime)
            data = blobs.read(entry.oid)
            info = tarfile.TarInfo(path)
            info.mtime = mtime
            info.uname = info.gname = "root"
            if entry.mode == MODE_LINK:
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode("utf-8", "surrogateescape")
                info.mode = 0o777
                tar.addfile(info)
                continue
            info.mode = 0o755 if entry.mode == MODE_EXEC else 0o644
            info.size = len(data)
            large = parse_placeholder(data)
            if large is not None:
                omitted.append(f"{large[0]} {large[1]} {path}\n")
            tar.addfile(info, io.BytesIO(data))
        if omitted:
            name = OMITTED
            n = 0
            while name in tree:
                n += 1
                name = f"{OMITTED}.{n}"
            listing = "".join(omitted).encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.mtime, info.mode, info.size = mtime, 0o644, len(listing)
            tar.addfile(info, io.BytesIO(listing))
    return counter.count


def _parents(tar: tarfile.TarFile, path: str, made: set[str], mtime: int) -> None:
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        directory = "/".join(parts[:i])
        if directory in made:
            continue
        made.add(directory)
        info = tarfile.TarInfo(directory)
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        info.mtime = mtime
        tar.addfile(info)
