"""Real git for the snapshot and seeding tests: repositories built with git, and a real
``git daemon`` on 127.0.0.1 (fetch and push), stopped when the test ends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

UID, GID = 1000, 1000


def git_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }


def git(cwd: Path, *args: str) -> str:
    """Test-side git (on repositories the test built, never on a workspace under test)."""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=git_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        path.write_bytes(data)


def make_repo(path: Path, files: Mapping[str, str | bytes], branch: str = "main") -> str:
    """A non-bare repository with one commit of ``files``; the commit id."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", branch)
    write_tree(path, files)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "seed commit")
    return git(path, "rev-parse", "HEAD")


def make_bare(base: Path, name: str, files: Mapping[str, str | bytes]) -> tuple[Path, str]:
    """A bare repository ``base/name`` holding one commit on main (and tag v1); its commit."""
    work = base / f"{name}.work"
    commit = make_repo(work, files)
    git(work, "tag", "v1")
    bare = base / name
    git(base, "clone", "-q", "--bare", str(work), str(bare))
    git(bare, "config", "http.receivepack", "true")
    return bare, commit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """``git daemon`` serving every repository under ``base`` (fetch and push); its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "git", "daemon", "--export-all", "--enable=receive-pack", "--reuseaddr",
            "--informative-errors", f"--base-path={base}", "--listen=127.0.0.1",
            f"--port={port}", str(base),
        ],
        env=git_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("git daemon did not start")
            time.sleep(0.05)
        yield f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
