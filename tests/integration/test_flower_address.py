"""Flower started as docs/operations.md says (``celery -A worker.app flower --port=N``) listens
on 127.0.0.1 only: it serves every task's arguments, prompts included, without
authentication. Another address is the operator's explicit choice (``--address``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import ROOT, require
from tests.integration.conftest import Env

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _own_address() -> str | None:
    """An IPv4 address of this machine other than loopback (eth0, the docker0 bridge)."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    for line in shown.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


def _answers(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/healthcheck", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def _flower(env: Env, *args: str) -> Iterator[int]:
    """Flower by the documented command line, plus ``args``; its port once it listens."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker.app", "flower", f"--port={port}", *args],
        cwd=ROOT,
        env={**os.environ, **env.vars},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            assert proc.poll() is None, "flower exited at start"
            assert time.monotonic() < deadline, "flower did not start listening"
            time.sleep(0.3)
        yield port
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def _answers_soon(address: str, port: int) -> bool:
    deadline = time.monotonic() + 15
    while not _answers(address, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def _listening(port: int) -> bool:
    """Whether anything of this machine listens on ``port`` (any address)."""
    shown = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=False).stdout
    return any(line.split()[3].endswith(f":{port}") for line in shown.splitlines())


def test_the_documented_flower_command_listens_on_loopback_only(env: Env) -> None:
    address = _own_address()
    require(address is not None, "this machine has no address besides loopback")
    assert address is not None
    with _flower(env) as port:
        assert _answers_soon("127.0.0.1", port)
        assert not _answers(address, port), f"flower answers on {address}"


def test_flower_listens_elsewhere_only_when_told(env: Env) -> None:
    address = _own_address()
    require(address is not None, "this machine has no address besides loopback")
    assert address is not None
    with _flower(env, f"--address={address}") as port:
        assert _answers_soon(address, port)
        assert not _answers("127.0.0.1", port)
