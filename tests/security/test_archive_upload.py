"""``--archive`` is read as a regular file, bounded while it is read: a folder, a device or a
pipe is a clear refusal (never a traceback, never a read without end), and a file that grows
past the operator's limit while being pushed leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fakeredis
import pytest

from worker.errors import InvalidInput
from worker.store.transfer import upload

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.mark.parametrize("path", ["/tmp", "/dev/zero"], ids=["a folder", "a device"])
def test_what_is_not_a_file_is_refused_naming_it(client: fakeredis.FakeRedis, path: str) -> None:
    with pytest.raises(InvalidInput, match="not a file"):
        upload(client, "k", Path(path), 1 << 20, 60)
    assert not client.exists("k")


def test_a_pipe_is_refused_without_waiting_for_a_writer(
    client: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # so the reader's open does not block
    try:
        with pytest.raises(InvalidInput, match="not a file"):
            upload(client, "k", fifo, 1 << 20, 60)
    finally:
        os.close(writer)


def test_a_file_over_the_limit_is_refused_before_anything_is_pushed(
    client: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    big = tmp_path / "big.tar"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(InvalidInput, match="HARNESS_ARCHIVE_MAX_BYTES"):
        upload(client, "k", big, 1024, 60)
    assert not client.exists("k")


def test_a_regular_file_is_pushed_whole(client: fakeredis.FakeRedis, tmp_path: Path) -> None:
    small = tmp_path / "small.tar"
    small.write_bytes(b"y" * 3000)
    digest, size = upload(client, "k", small, 1 << 20, 60)
    assert size == 3000 and b"".join(client.lrange("k", 0, -1)) == b"y" * 3000
    assert len(digest) == 64


def test_the_command_line_says_why_and_exits_2_for_a_folder(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HARNESS_SANDBOX": "local",
        "HARNESS_ALLOWED_SANDBOXES": "*",
        "HARNESS_ALLOWED_EXECUTABLES": "*",
        "HARNESS_KEY_PREFIX": "archive-folder-test",
    }
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "stdio-json", "hi", "--executable",
         "harness-demo", "--archive", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    assert "not a file" in done.stderr and done.returncode == 2, done.stderr
