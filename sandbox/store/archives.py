"""Unpacking a producer's archive (tar, tar.gz or zip, told apart by content) into a workspace.

One pass: each member is checked against every rule below before anything of it is written,
and a refusal (or any failure) removes everything the extraction created, through the
writer's own list of what it created, so nothing that was there before is touched. Refused:

- a path that is absolute, has a ``..``, ``.`` (except a leading ``./``) or empty component,
  a NUL, a component over 255 bytes, over 4096 bytes in all, is not UTF-8 (tar gives bytes;
  zip names are decoded by the format's own rule), or lies under ``.home`` (the harness's
  HOME is not the archive's to fill);
- a symlink whose target is absolute, or climbs with ``..`` anywhere but at its start, or
  climbs above the workspace; a hard link to anything but an earlier regular file member
  (it is written as a copy); a member under a symlink or a file member; a device, FIFO,
  sparse or unknown member; a duplicate path;
- more members than ``max_files``; more than ``max_unpacked_bytes`` in all; a compression
  ratio above ``max_ratio`` (unpacked bytes over the archive's size, per zip member and for
  the whole archive, once past :data:`RATIO_FLOOR` so that small, very compressible files
  pass). Sizes are counted from the bytes actually decompressed, not from headers, and the
  count stops the read as soon as a bound is passed (a gzip stream is read through a
  counting reader, so even a tar header cannot make it inflate without bound).

Writing goes through :class:`sandbox.store.safe_fs.SafeWriter` (no link followed, files
``0644``/``0755``, owned by ``uid:gid``); a member under a symlink is refused before the
writer could be asked to pass through it, and the writer would refuse anyway.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from sandbox.base import ArchiveRefused, UnsafePath
from sandbox.store.safe_fs import READ_FLAGS, SafeWriter, list_names

MiB = 1024 * 1024
RATIO_FLOOR = MiB
CHUNK = 1 << 20
MAX_NAME = 255
MAX_PATH = 4096
MAX_LINK = 4096

Kind = Literal["file", "dir", "symlink", "hardlink"]


@dataclass(frozen=True)
class ArchiveLimits:
    """Operator bounds of one archive."""

    max_bytes: int = 256 * MiB
    """The archive file itself."""
    max_files: int = 100_000
    max_unpacked_bytes: int = 2048 * MiB
    max_ratio: float = 200.0


@dataclass(frozen=True)
class _Member:
    path: str
    kind: Kind
    executable: bool
    target: str = ""


FileSeen = Callable[[str, bool, bytes, os.stat_result], None]
"""Told of each regular file written: (path, executable, its bytes, its final ``fstat``)."""


def extract_archive(
    path: Path,
    workspace: Path,
    limits: ArchiveLimits,
    uid: int,
    gid: int,
    seen: FileSeen | None = None,
    seen_max_bytes: int = 0,
) -> int:
    """Unpack ``path`` into ``workspace``; the number of members written.
    :class:`ArchiveRefused` (nothing left behind) when any rule of the module is broken.
    ``seen`` is told of every file written of at most ``seen_max_bytes`` (a caller that
    records the files needs not read them back)."""
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise ArchiveRefused(f"the archive is {size} bytes, above the limit of {limits.max_bytes}")
    kind = detect(path)
    reader = _ZipReader(path, limits, size) if kind == "zip" else _TarReader(path, limits, size)
    rules = _Rules(limits)
    written = 0
    writer = SafeWriter(workspace, uid, gid)
    members = reader.members()
    try:
        with writer, contextlib.closing(members):
            for member, data in members:
                rules.check(member)
                _write(writer, member, data, seen, seen_max_bytes)
                written += 1
    except (ArchiveRefused, UnsafePath, OSError) as exc:
        _undo(workspace, writer.created, uid, gid)
        if isinstance(exc, ArchiveRefused):
            raise
        raise ArchiveRefused(f"cannot unpack the archive: {exc}") from exc
    return written


def list_names_of(directory: Path) -> list[str]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return list_names(fd)
    finally:
        os.close(fd)


def detect(path: Path) -> Literal["zip", "gzip", "tar"]:
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[257:262] == b"ustar":
        return "tar"
    raise ArchiveRefused("not a tar, tar.gz or zip archive")


# -- names and links ---------------------------------------------------------------------


def clean_name(raw: str, is_dir: bool = False) -> str:
    """The member's relative path, or :class:`ArchiveRefused` naming what is wrong with it."""
    shown = repr(raw)[:200]
    if "\0" in raw:
        raise ArchiveRefused(f"member {shown}: a NUL in its name")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveRefused(f"member {shown}: its name is not UTF-8") from None
    if len(encoded) > MAX_PATH:
        raise ArchiveRefused(f"member {shown}: its name is over {MAX_PATH} bytes")
    if raw.startswith("/"):
        raise ArchiveRefused(f"member {shown}: an absolute path")
    name = raw
    while name.startswith("./"):
        name = name[2:]
    if is_dir or name.endswith("/"):
        name = name[:-1] if name.endswith("/") else name
    if name in ("", "."):
        return ""  # the archive's root directory
    for part in name.split("/"):
        if part == "..":
            raise ArchiveRefused(f"member {shown}: a '..' component")
        if part in ("", "."):
            raise ArchiveRefused(f"member {shown}: an empty or '.' component")
        if len(part.encode("utf-8")) > MAX_NAME:
            raise ArchiveRefused(f"member {shown}: a component over {MAX_NAME} bytes")
    if name.split("/")[0] == ".home":
        raise ArchiveRefused(f"member {shown}: .home is the harness's HOME")
    return name


def check_link_target(path: str, target: str) -> None:
    """A symlink may only point inside the tree: relative, ``..`` only leading, and no higher
    than its own directory's depth (a later ``..`` could climb back out through a link)."""
    shown = repr(path)[:200]
    if not target or "\0" in target or len(target.encode("utf-8", "surrogateescape")) > MAX_LINK:
        raise ArchiveRefused(f"member {shown}: an invalid link target")
    if target.startswith("/"):
        raise ArchiveRefused(f"member {shown}: a link to an absolute path ({target[:100]!r})")
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        raise ArchiveRefused(f"member {shown}: a link with '..' after a name ({target[:100]!r})")
    if ups > path.count("/"):
        raise ArchiveRefused(f"member {shown}: a link pointing outside ({target[:100]!r})")


class _Rules:
    """The rules that span members, checked one member at a time, before it is written."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.kinds: dict[str, Kind] = {}
        self.count = 0

    def check(self, member: _Member) -> None:
        kinds = self.kinds
        self.count += 1
        if self.count > self.limits.max_files:
            raise ArchiveRefused(f"more than {self.limits.max_files} members")
        parent = member.path.rpartition("/")[0]
        if parent and kinds.get(parent) != "dir":
            parts = member.path.split("/")
            for i in range(1, len(parts)):
                found = kinds.setdefault("/".join(parts[:i]), "dir")
                if found != "dir":
                    raise ArchiveRefused(f"member {member.path!r}: lies under a {found} member")
        existing = kinds.get(member.path)
        if existing is not None and not (existing == "dir" and member.kind == "dir"):
            raise ArchiveRefused(f"member {member.path!r}: appears twice")
        if member.kind == "symlink":
            check_link_target(member.path, member.target)
        if member.kind == "hardlink" and kinds.get(member.target) != "file":
            raise ArchiveRefused(
                f"member {member.path!r}: a hard link to {member.target!r}, not an earlier file"
            )
        kinds[member.path] = member.kind


# -- counting ----------------------------------------------------------------------------


class _Budget:
    """Unpacked bytes, counted as they are decompressed, against the archive's limits."""

    def __init__(self, limits: ArchiveLimits, archive_size: int) -> None:
        self.limits = limits
        self.archive_size = archive_size
        self.total = 0

    def ratio_cap(self, compressed: int) -> float:
        return max(RATIO_FLOOR, self.limits.max_ratio * max(compressed, 1))

    def add(self, n: int) -> None:
        self.total += n
        if self.total > self.limits.max_unpacked_bytes:
            raise ArchiveRefused(
                f"unpacks to more than {self.limits.max_unpacked_bytes} bytes (a zip bomb?)"
            )
        if self.total > self.ratio_cap(self.archive_size):
            raise ArchiveRefused(
                f"unpacks to more than {self.limits.max_ratio:g} times its size (a zip bomb?)"
            )


class _CountingReader(io.RawIOBase):
    """A decompressed stream that stops (refuses) once it passes the budget."""

    def __init__(self, inner: IO[bytes], budget: _Budget) -> None:
        self.inner = inner
        self.budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(len(buffer))
        self.budget.add(len(data))
        buffer[: len(data)] = data
        return len(data)


# -- tar ---------------------------------------------------------------------------------


class _TarReader:
    def __init__(self, path: Path, limits: ArchiveLimits, size: int) -> None:
        self.path = path
        self.limits = limits
        self.size = size

    def members(self) -> Generator[tuple[_Member, Iterator[bytes]], None, None]:
        """Each member with its data (read forward only: a stream, never seeked)."""
        budget = _Budget(self.limits, self.size)
        # The stream's bound also covers headers and padding (a pax header is read whole into
        # memory, so its size must be bounded too); file contents are bounded exactly below.
        budget.limits = ArchiveLimits(
            self.limits.max_bytes,
            self.limits.max_files,
            self.limits.max_unpacked_bytes + 1536 * (self.limits.max_files + 1),
            self.limits.max_ratio,
        )
        with open(self.path, "rb") as raw:
            source: IO[bytes] = raw
            if detect(self.path) == "gzip":
                source = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
            counted = io.BufferedReader(_CountingReader(source, budget), CHUNK)
            try:
                with tarfile.open(fileobj=counted, mode="r|") as tar:
                    count = content = 0
                    for info in tar:
                        count += 1
                        if count > self.limits.max_files:
                            raise ArchiveRefused(f"more than {self.limits.max_files} members")
                        content += info.size
                        if content > self.limits.max_unpacked_bytes:
                            raise ArchiveRefused(
                                f"unpacks to more than {self.limits.max_unpacked_bytes} bytes"
                            )
                        member = _tar_member(info)
                        if member is None:
                            continue
                        data = _tar_data(tar, info) if member.kind == "file" else iter(())
                        yield member, data
                        for _ in data:  # drain what the consumer left (validation pass)
                            pass
            except (tarfile.TarError, EOFError, OSError, UnicodeError) as exc:
                raise ArchiveRefused(f"not a valid tar archive: {exc}") from exc


def _tar_member(info: tarfile.TarInfo) -> _Member | None:
    if info.issparse():
        raise ArchiveRefused(f"member {info.name!r}: a sparse file")
    if info.isdir():
        name = clean_name(info.name, is_dir=True)
        return _Member(name, "dir", False) if name else None
    name = clean_name(info.name)
    if not name:
        raise ArchiveRefused(f"member {info.name!r}: a non-directory at the archive's root")
    if info.isreg():
        return _Member(name, "file", bool(info.mode & 0o111))
    if info.issym():
        return _Member(name, "symlink", False, info.linkname)
    if info.islnk():
        return _Member(name, "hardlink", False, clean_name(info.linkname))
    if info.ischr() or info.isblk():
        raise ArchiveRefused(f"member {name!r}: a device file")
    if info.isfifo():
        raise ArchiveRefused(f"member {name!r}: a FIFO")
    raise ArchiveRefused(f"member {name!r}: an unsupported member type {info.type!r}")


def _tar_data(tar: tarfile.TarFile, info: tarfile.TarInfo) -> Iterator[bytes]:
    # Read by the writer, outside :meth:`_TarReader.members`: its errors are translated here.
    source = tar.extractfile(info)
    if source is None:
        return
    while True:
        try:
            chunk = source.read(CHUNK)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise ArchiveRefused(f"not a valid tar archive: {exc}") from exc
        if not chunk:
            return
        yield chunk


# -- zip ---------------------------------------------------------------------------------


class _ZipReader:
    def __init__(self, path: Path, limits: ArchiveLimits, size: int) -> None:
        self.path = path
        self.limits = limits
        self.size = size

    def members(self) -> Generator[tuple[_Member, Iterator[bytes]], None, None]:
        budget = _Budget(self.limits, self.size)
        try:
            with zipfile.ZipFile(self.path) as archive:
                infos = archive.infolist()
                if len(infos) > self.limits.max_files:
                    raise ArchiveRefused(f"more than {self.limits.max_files} members")
                for info in infos:
                    member = _zip_member(archive, info, budget)
                    if member is None:
                        continue
                    if member.kind != "file":
                        yield member, iter(())
                        continue
                    data = _zip_data(archive, info, budget)
                    yield member, data
                    for _ in data:
                        pass
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
            raise ArchiveRefused(f"not a valid zip archive: {exc}") from exc
        except (UnicodeError, NotImplementedError, RuntimeError) as exc:
            raise ArchiveRefused(f"an unreadable zip member: {exc}") from exc


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: _Budget) -> _Member | None:
    mode = info.external_attr >> 16 if info.create_system == 3 else 0
    file_type = stat.S_IFMT(mode)
    if info.is_dir():
        name = clean_name(info.filename, is_dir=True)
        return _Member(name, "dir", False) if name else None
    name = clean_name(info.filename)
    if not name:
        raise ArchiveRefused(f"member {info.filename!r}: a non-directory at the archive's root")
    if file_type == stat.S_IFLNK:
        target = b"".join(_zip_data(archive, info, budget, limit=MAX_LINK))
        try:
            return _Member(name, "symlink", False, target.decode("utf-8"))
        except UnicodeDecodeError:
            raise ArchiveRefused(f"member {name!r}: a link target that is not UTF-8") from None
    if file_type in (stat.S_IFCHR, stat.S_IFBLK):
        raise ArchiveRefused(f"member {name!r}: a device file")
    if file_type == stat.S_IFIFO:
        raise ArchiveRefused(f"member {name!r}: a FIFO")
    if file_type not in (0, stat.S_IFREG):
        raise ArchiveRefused(f"member {name!r}: an unsupported member type")
    return _Member(name, "file", bool(mode & 0o111))


def _zip_data(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: _Budget, limit: int | None = None
) -> Iterator[bytes]:
    cap = budget.ratio_cap(info.compress_size)
    seen = 0
    # Read by the writer, outside :meth:`_ZipReader.members`: its errors are translated here.
    try:
        source = archive.open(info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
        raise ArchiveRefused(f"not a valid zip archive: {exc}") from exc
    except (UnicodeError, NotImplementedError, RuntimeError) as exc:
        raise ArchiveRefused(f"an unreadable zip member: {exc}") from exc
    with source:
        while True:
            try:
                chunk = source.read(CHUNK)
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
                raise ArchiveRefused(f"not a valid zip archive: {exc}") from exc
            except (NotImplementedError, RuntimeError) as exc:
                raise ArchiveRefused(f"an unreadable zip member: {exc}") from exc
            if not chunk:
                return
            seen += len(chunk)
            budget.add(len(chunk))
            if seen > cap:
                raise ArchiveRefused(
                    f"member {info.filename!r}: unpacks to more than "
                    f"{budget.limits.max_ratio:g} times its compressed size (a zip bomb?)"
                )
            if limit is not None and seen > limit:
                raise ArchiveRefused(f"member {info.filename!r}: a link target too long")
            yield chunk


# -- writing -----------------------------------------------------------------------------


def _write(
    writer: SafeWriter,
    member: _Member,
    data: Iterator[bytes],
    seen: FileSeen | None,
    seen_max_bytes: int,
) -> None:
    if member.kind == "dir":
        writer.directory(member.path)
        return
    if member.kind == "symlink":
        check_link_target(member.path, member.target)
        writer.symlink(member.path, member.target)
        return
    executable = member.executable
    if member.kind == "hardlink":
        data, executable = _copy_of(writer, member.target), False
    if seen is None:
        writer.write_file(member.path, data, executable)
        return
    kept: list[bytes] = []
    total = 0

    def tee() -> Iterator[bytes]:
        nonlocal total
        for chunk in data:
            total += len(chunk)
            if total <= seen_max_bytes:
                kept.append(chunk)
            yield chunk

    st = writer.write_file(member.path, tee(), executable)
    if total <= seen_max_bytes:
        seen(member.path, executable, b"".join(kept), st)


def _copy_of(writer: SafeWriter, path: str) -> Iterator[bytes]:
    """The bytes of a file this extraction wrote (a hard link's source), read without
    following a link."""
    parent_path, _, name = path.rpartition("/")
    fd = os.open(name, READ_FLAGS, dir_fd=writer.directory(parent_path, create=False))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArchiveRefused(f"member {path!r}: a hard link source that is not a file")
        while chunk := os.read(fd, CHUNK):
            yield chunk
    finally:
        os.close(fd)


def _undo(workspace: Path, created: list[str], uid: int, gid: int) -> None:
    """Remove what an interrupted extraction created (the newest first), nothing else."""
    with SafeWriter(workspace, uid, gid) as writer:
        for path in reversed(created):
            writer.remove(path)
