"""Every archive attack, tar and zip, each refused with nothing written outside
the workspace and nothing left inside it."""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.store.seeding import ArchiveLimits, ArchiveRefused, extract_archive
from tests.unit.sandbox_snapshots.git_fixtures import GID, UID

Member = tuple[str, str, bytes | str]
"""(kind, name, data or link target): kind is file, dir, symlink, hardlink, chr, fifo."""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "root" / "run" / "r1"
    (workspace / ".home").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return workspace


def make_tar(
    path: Path, members: list[Member], fmt: int = tarfile.PAX_FORMAT, gz: bool = True
) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w", format=fmt) as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            data = payload if isinstance(payload, bytes) else b""
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE,
            }[kind]  # fmt: skip
            if isinstance(payload, str):
                info.linkname = payload
            tar.addfile(info)
    return path


def make_zip(path: Path, members: list[Member]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for kind, name, payload in members:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            mode = {"file": stat.S_IFREG | 0o644, "dir": stat.S_IFDIR | 0o755,
                    "symlink": stat.S_IFLNK | 0o777, "fifo": stat.S_IFIFO | 0o644,
                    "chr": stat.S_IFCHR | 0o644}[kind]  # fmt: skip
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, payload.encode() if isinstance(payload, str) else payload)
    return path


Maker = Callable[[Path, list[Member]], Path]
BOTH = [pytest.param(make_tar, id="tar"), pytest.param(make_zip, id="zip")]


def refused(archive: Path, ws: Path, match: str, limits: ArchiveLimits | None = None) -> None:
    outside = ws.parent.parent.parent / "outside"
    with pytest.raises(ArchiveRefused, match=match):
        extract_archive(archive, ws, limits or ArchiveLimits(), UID, GID)
    assert sorted(os.listdir(ws)) == [".home"], "something was left in the workspace"
    assert os.listdir(outside) == [], "something was written outside the workspace"


@pytest.mark.parametrize("maker", BOTH)
def test_absolute_path_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    target = str(tmp_path / "outside" / "evil")
    refused(
        maker(tmp_path / "a", [("file", "ok.txt", b"ok"), ("file", target, b"x")]), ws, "absolute"
    )


@pytest.mark.parametrize("maker", BOTH)
def test_dotdot_path_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    archive = maker(
        tmp_path / "a", [("file", "ok.txt", b"ok"), ("file", "a/../../../../outside/evil", b"x")]
    )
    refused(archive, ws, r"'\.\.'")


@pytest.mark.parametrize("maker", BOTH)
def test_symlink_to_absolute_path_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    refused(maker(tmp_path / "a", [("symlink", "etc", "/etc")]), ws, "absolute path")


@pytest.mark.parametrize("maker", BOTH)
def test_symlink_climbing_out_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    refused(maker(tmp_path / "a", [("symlink", "d/up", "../../outside")]), ws, "pointing outside")


def test_symlink_chain_escaping_through_a_dot_link_is_refused(ws: Path, tmp_path: Path) -> None:
    # s -> . then t -> s/s/.. : each looks inside lexically, t resolves to the parent.
    archive = make_tar(tmp_path / "a", [("symlink", "s", "."), ("symlink", "t", "s/s/..")])
    refused(archive, ws, "after a name")


@pytest.mark.parametrize("maker", BOTH)
def test_member_written_through_a_symlink_is_refused(
    maker: Maker, ws: Path, tmp_path: Path
) -> None:
    archive = maker(tmp_path / "a", [("symlink", "link", "sub"), ("file", "link/evil", b"x")])
    refused(archive, ws, "under a symlink member")


def test_hardlink_to_an_absolute_path_is_refused(ws: Path, tmp_path: Path) -> None:
    refused(make_tar(tmp_path / "a", [("hardlink", "passwd", "/etc/passwd")]), ws, "absolute")


def test_hardlink_outside_the_archive_is_refused(ws: Path, tmp_path: Path) -> None:
    refused(make_tar(tmp_path / "a", [("hardlink", "x", "../outside/f")]), ws, r"'\.\.'")


def test_hardlink_to_a_member_not_yet_written_is_refused(ws: Path, tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a", [("hardlink", "x", "later"), ("file", "later", b"l")])
    refused(archive, ws, "not an earlier file")


@pytest.mark.parametrize("maker", BOTH)
def test_device_member_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    refused(maker(tmp_path / "a", [("file", "ok", b"ok"), ("chr", "null", b"")]), ws, "device")


@pytest.mark.parametrize("maker", BOTH)
def test_fifo_member_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    refused(maker(tmp_path / "a", [("fifo", "pipe", b"")]), ws, "FIFO")


def test_zip_bomb_member_ratio_is_refused(ws: Path, tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "a", [("file", "zeros", b"\0" * (8 << 20))])
    refused(archive, ws, "times its", ArchiveLimits(max_ratio=50))


def test_gzip_bomb_total_ratio_is_refused(ws: Path, tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a", [("file", "zeros", b"\0" * (8 << 20))])
    refused(archive, ws, "times its size", ArchiveLimits(max_ratio=50))


@pytest.mark.parametrize("maker", BOTH)
def test_total_unpacked_bound_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    members: list[Member] = [("file", f"f{i}", os.urandom(100_000)) for i in range(5)]
    refused(
        maker(tmp_path / "a", members),
        ws,
        "unpacks to more than",
        ArchiveLimits(max_unpacked_bytes=300_000),
    )


def test_zip_whose_headers_lie_about_size_is_refused(ws: Path, tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "a", [("file", "zeros", b"\0" * (4 << 20))])
    data = bytearray(archive.read_bytes())
    # Claim 100 bytes uncompressed in both headers: a reader trusting them would not stop.
    local = data.find(b"PK\x03\x04")
    struct.pack_into("<I", data, local + 22, 100)
    central = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 100)
    archive.write_bytes(bytes(data))
    refused(archive, ws, "zip|CRC|times")


@pytest.mark.parametrize("maker", BOTH)
def test_more_members_than_max_files_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    members: list[Member] = [("file", f"f{i}", b"x") for i in range(20)]
    refused(maker(tmp_path / "a", members), ws, "more than 10 members", ArchiveLimits(max_files=10))


@pytest.mark.parametrize("maker", BOTH)
def test_component_over_255_bytes_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    refused(maker(tmp_path / "a", [("file", "d/" + "n" * 256, b"x")]), ws, "over 255 bytes")


def test_path_over_4096_bytes_is_refused(ws: Path, tmp_path: Path) -> None:
    name = "/".join(["d" * 200] * 21)
    refused(make_tar(tmp_path / "a", [("file", name, b"x")]), ws, "over 4096 bytes")


def test_empty_component_is_refused(ws: Path, tmp_path: Path) -> None:
    refused(make_tar(tmp_path / "a", [("file", "a//b", b"x")]), ws, "empty")


def test_nul_in_a_name_is_refused(ws: Path, tmp_path: Path) -> None:
    # A pax path record carries the NUL (a plain header field would end at it).
    refused(make_tar(tmp_path / "a", [("file", "\u00e9a\0b", b"x")]), ws, "NUL")


def test_non_utf8_tar_name_is_refused(ws: Path, tmp_path: Path) -> None:
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    archive = make_tar(tmp_path / "a", [("file", name, b"x")], fmt=tarfile.GNU_FORMAT)
    refused(archive, ws, "not UTF-8")


@pytest.mark.parametrize("maker", BOTH)
def test_member_under_home_is_refused(maker: Maker, ws: Path, tmp_path: Path) -> None:
    archive = maker(tmp_path / "a", [("file", ".home/.claude/settings.json", b"{}")])
    refused(archive, ws, "HOME")


def test_duplicate_member_is_refused(ws: Path, tmp_path: Path) -> None:
    refused(make_tar(tmp_path / "a", [("file", "a", b"1"), ("file", "a", b"2")]), ws, "twice")


def test_not_an_archive_is_refused(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"BZh91AY&SY" + b"\0" * 600)
    refused(tmp_path / "a", ws, "not a tar, tar.gz or zip")


def test_archive_above_max_bytes_is_refused(ws: Path, tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a", [("file", "r", os.urandom(5000))])
    refused(archive, ws, "above the limit", ArchiveLimits(max_bytes=1000))


def test_refusal_while_writing_removes_what_was_written(ws: Path, tmp_path: Path) -> None:
    # Every member passes the rules; the workspace already has a directory where a file
    # goes, so the write fails half-way: what was written is undone, what was there is kept.
    (ws / "clash").mkdir()
    (ws / "clash" / "keep.txt").write_text("mine")
    archive = make_tar(tmp_path / "a", [("file", "first.txt", b"1"), ("file", "clash", b"2")])
    with pytest.raises(ArchiveRefused):
        extract_archive(archive, ws, ArchiveLimits(), UID, GID)
    assert sorted(os.listdir(ws)) == [".home", "clash"]
    assert (ws / "clash" / "keep.txt").read_text() == "mine"
