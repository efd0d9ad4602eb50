"""Seeding a workspace: URL policy, a real repository over file:// and git daemon, archives."""

from __future__ import annotations

import functools
import io
import os
import socket
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox.store.seeding import (
    ArchiveLimits,
    ArchiveRefused,
    SeedError,
    SeedUnreachable,
    check_repo_url,
    git_auth_env,
    seed_from_archive,
    seed_from_repo,
    take_baseline,
)
from sandbox.store.snapshots import SnapshotLimits, SnapshotStore
from tests.unit.sandbox_snapshots.git_fixtures import GID, UID, git, git_daemon, make_bare

FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n", "docs/big.txt": "x" * 3000}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def ws(root: Path) -> Path:
    workspace = root / "run" / "r1"
    (workspace / ".home").mkdir(parents=True)
    return workspace


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, str]:
    base = tmp_path / "served"
    base.mkdir()
    _, commit = make_bare(base, "repo.git", FILES)
    return base, commit


def store_for(root: Path, **limits: object) -> SnapshotStore:
    return SnapshotStore(root, "r1", SnapshotLimits(**limits))  # type: ignore[arg-type]


# -- URL policy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "schemes", "hosts", "message"),
    [
        ("https://user:pw@example.com/r.git", {"https"}, {"*"}, "credentials"),
        ("https://token@example.com/r.git", {"https"}, {"example.com"}, "credentials"),
        ("http://example.com/r.git", {"https"}, {"*"}, "scheme 'http' is not allowed"),
        ("ext::sh -c touch% /tmp/x", {"https"}, {"*"}, "whitespace"),
        ("git@example.com:r.git", {"https", "ssh"}, {"*"}, "scp-like"),
        (
            "https://evil.example/r.git",
            {"https"},
            {"github.com"},
            "host 'evil.example' is not allowed",
        ),
        ("https://localhost/r.git", {"https"}, {"*"}, "non-public address"),
        ("https://127.0.0.1:8443/r.git", {"https"}, {"*"}, "non-public address"),
        ("https://169.254.169.254/latest", {"https"}, {"*"}, "non-public address"),
        ("https://10.1.2.3/r.git", {"https"}, {"*"}, "non-public address"),
        ("https://[::1]/r.git", {"https"}, {"*"}, "non-public address"),
        ("https://[::ffff:127.0.0.1]/r.git", {"https"}, {"*"}, "non-public address"),
        ("file://otherhost/srv/r.git", {"file"}, {"*"}, "names no host"),
    ],
)
def test_url_policy_refuses(url: str, schemes: set[str], hosts: set[str], message: str) -> None:
    with pytest.raises(SeedError, match=message):
        check_repo_url(url, schemes, hosts)


@pytest.mark.parametrize(
    ("url", "schemes", "hosts"),
    [
        ("https://localhost/r.git", {"https"}, {"localhost"}),  # named explicitly: trusted
        ("git://127.0.0.1:9418/r.git", {"git"}, {"127.0.0.1"}),
        ("file:///srv/r.git", {"file"}, set()),
        ("HTTPS://Example.COM/r.git", {"https"}, {"example.com"}),
    ],
)
def test_url_policy_allows(url: str, schemes: set[str], hosts: set[str]) -> None:
    check_repo_url(url, schemes, hosts)


def test_auth_env_is_a_basic_header_in_config_env_only() -> None:
    env = git_auth_env("s3cr3t-token")
    assert env["GIT_CONFIG_COUNT"] == "1" and env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    assert "s3cr3t-token" not in env["GIT_CONFIG_VALUE_0"]  # base64 of user:token


# -- repository ----------------------------------------------------------------------------


def test_seed_from_file_url_writes_tree_gives_a_working_git_and_turn_zero_on_seed(
    root: Path, ws: Path, served: tuple[Path, str]
) -> None:
    base, commit = served
    store = store_for(root, max_file_bytes=1000)
    url = f"file://{base}/repo.git"

    summary = seed_from_repo(store, ws, url, None, {}, UID, GID, 60)

    assert (ws / "README.md").read_text() == "hello\n"
    assert (summary.added, summary.modified, summary.deleted, summary.large) == ((), (), (), ())
    if os.geteuid() == 0:
        assert (ws / ".git" / "index").stat().st_uid == UID
        assert (ws / "src" / "app.py").stat().st_uid == UID
    assert git(store.path, "rev-parse", "refs/turns/0^") == commit
    assert git(ws, "rev-parse", "HEAD") == commit
    assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git(ws, "status", "--porcelain") == ""  # the index matches, .home excluded
    assert git(ws, "config", "remote.origin.url") == url


def test_seed_over_git_daemon_by_tag_and_by_commit_then_push_builds_on_seed(
    root: Path, tmp_path: Path, served: tuple[Path, str]
) -> None:
    base, commit = served
    with git_daemon(base) as url:
        for n, ref in enumerate(("v1", commit)):
            workspace = root / "run" / f"w{n}"
            workspace.mkdir(parents=True)
            store = SnapshotStore(root, f"w{n}")
            seed_from_repo(store, workspace, f"{url}/repo.git", ref, {}, UID, GID, 60)
            assert git(workspace, "rev-parse", "HEAD") == commit
            assert (workspace / "src/app.py").exists()
        (workspace / "NEW.md").write_text("agent work\n")
        store.take(workspace, 1, "add NEW.md")
        store.push(f"{url}/repo.git", "agent", 1, {})
    remote = base / "repo.git"
    assert git(remote, "log", "--format=%s", "agent").splitlines() == [
        "add NEW.md",
        f"seed: {url}/repo.git at {commit[:12]}",
        "seed commit",
    ]


def test_wrong_ref_is_a_seed_error_and_leaves_nothing_behind(
    root: Path, ws: Path, served: tuple[Path, str]
) -> None:
    base, _ = served
    store = store_for(root)
    with pytest.raises(SeedError, match="no branch, tag or commit named 'nope'"):
        seed_from_repo(store, ws, f"file://{base}/repo.git", "nope", {}, UID, GID, 60)
    assert not store.exists() and sorted(os.listdir(ws)) == [".home"]
    missing = "0" * 40
    with pytest.raises(SeedError):
        seed_from_repo(store, ws, f"file://{base}/repo.git", missing, {}, UID, GID, 60)
    assert not store.exists() and sorted(os.listdir(ws)) == [".home"]


def test_unreachable_repository_error_never_shows_the_secret(root: Path, ws: Path) -> None:
    store = store_for(root)
    secret = "ghp_SUPERSECRETTOKEN123"
    with pytest.raises(SeedError) as caught:
        seed_from_repo(
            store, ws, "http://127.0.0.1:9/r.git", None, git_auth_env(secret), UID, GID, 20
        )
    assert secret not in str(caught.value) and "127.0.0.1" in str(caught.value)
    assert sorted(os.listdir(ws)) == [".home"]


# -- archive and baseline ------------------------------------------------------------------


def test_seed_from_tar_gz_keeps_modes_and_inner_links(root: Path, ws: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.bin"  # detected by content, not name
    with tarfile.open(archive, "w:gz") as tar:
        for name, data, mode in (
            ("./pkg/run.sh", b"#!/bin/sh\n", 0o755),
            ("./pkg/a.txt", b"a\n", 0o600),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("pkg/link")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
        hard = tarfile.TarInfo("pkg/copy.txt")
        hard.type, hard.linkname = tarfile.LNKTYPE, "./pkg/a.txt"
        tar.addfile(hard)
    summary = seed_from_archive(store_for(root), ws, archive, ArchiveLimits(), UID, GID)
    assert summary.added == ("pkg/a.txt", "pkg/copy.txt", "pkg/link", "pkg/run.sh")
    assert os.stat(ws / "pkg/run.sh").st_mode & 0o777 == 0o755
    assert os.stat(ws / "pkg/a.txt").st_mode & 0o777 == 0o644
    assert os.readlink(ws / "pkg/link") == "a.txt" and (ws / "pkg/copy.txt").read_text() == "a\n"


def test_seed_from_zip(root: Path, ws: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("dir/", "")
        z.writestr("dir/x.txt", "x" * 1000)
    summary = seed_from_archive(store_for(root), ws, archive, ArchiveLimits(), UID, GID)
    assert summary.added == ("dir/x.txt",) and (ws / "dir/x.txt").read_text() == "x" * 1000


def test_baseline_of_an_empty_workspace(root: Path, ws: Path) -> None:
    summary = take_baseline(store_for(root), ws)
    assert summary.turn == 0 and summary.added == ()


def test_archive_seed_records_files_without_reading_them_and_still_sees_forged_edits(
    root: Path, ws: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "a.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in (("a.txt", b"aaaa"), ("big.bin", b"z" * 3000), ("d/b.txt", b"b\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    store = store_for(root, max_file_bytes=1000)
    seeded = seed_from_archive(store, ws, archive, ArchiveLimits(), UID, GID)
    assert seeded.added == ("a.txt", "big.bin", "d/b.txt") and seeded.large == ("big.bin",)
    assert git(store.path, "show", "refs/turns/0:d/b.txt") == "b"
    before = (ws / "a.txt").stat()
    (ws / "a.txt").write_text("bbbb")
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime still moves
    assert store.take(ws, 1, "sneaky").modified == ("a.txt",)


def test_refused_archive_seed_leaves_no_store(root: Path, ws: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("ok.txt", "../escape.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    store = store_for(root)
    with pytest.raises(ArchiveRefused, match=r"'\.\.' component"):
        seed_from_archive(store, ws, archive, ArchiveLimits(), UID, GID)
    assert not store.exists() and sorted(os.listdir(ws)) == [".home"]


@pytest.fixture
def dumb_http(served: tuple[Path, str]) -> Iterator[str]:
    """The served repositories over git's dumb HTTP: plain files (``update-server-info``),
    no smart protocol, so no shallow fetch."""
    base, _ = served
    git(base / "repo.git", "update-server-info")
    handler = functools.partial(_QuietFiles, directory=str(base))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_seed_over_dumb_http_falls_back_to_a_full_fetch(
    root: Path, dumb_http: str, served: tuple[Path, str]
) -> None:
    _, commit = served
    for n, ref in enumerate((None, "v1")):
        workspace = root / "run" / f"d{n}"
        workspace.mkdir(parents=True)
        store = SnapshotStore(root, f"d{n}")
        seed_from_repo(store, workspace, f"{dumb_http}/repo.git", ref, {}, UID, GID, 60)
        assert git(workspace, "rev-parse", "HEAD") == commit
        assert (workspace / "src/app.py").read_text() == "print('hi')\n"
        assert git(workspace, "status", "--porcelain") == ""


def test_a_repository_that_cannot_be_reached_is_worth_retrying_one_not_there_is_not(
    root: Path, ws: Path, dumb_http: str
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(SeedUnreachable, match="cannot read the repository"):
        seed_from_repo(
            store_for(root), ws, f"http://127.0.0.1:{closed}/r.git", None, {}, UID, GID, 20
        )
    assert sorted(os.listdir(ws)) == [".home"]
    with pytest.raises(SeedError, match="not found") as caught:
        seed_from_repo(store_for(root), ws, f"{dumb_http}/nope.git", None, {}, UID, GID, 20)
    assert not isinstance(caught.value, SeedUnreachable)
    assert sorted(os.listdir(ws)) == [".home"]
