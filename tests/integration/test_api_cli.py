"""Tenants and labels on the command line: ``harness tenant``, ``run --label`` with
``harness list``, and ``harness api`` (the Procfile's line) serving the API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.api_server import free_port
from tests.integration.conftest import DEMO, Env

pytestmark = [pytest.mark.redis]


def harness(env: Env, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env.vars, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tenant_add_list_rotate_revoke(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    added = harness(env, "tenant", "--file", str(path), "add", "acme", "--harness", "stdio-json")
    assert added.returncode == 0, added.stderr
    key = added.stdout.splitlines()[1]
    assert key.startswith("hk_") and key not in path.read_text()
    again = harness(env, "tenant", "--file", str(path), "add", "acme")
    assert again.returncode == 2 and "exists" in again.stderr
    listed = harness(env, "tenant", "list", "--json", HARNESS_TENANTS_FILE=str(path))
    (shown,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert shown["name"] == "acme" and shown["policy"]["harnesses"] == ["stdio-json"]
    assert "sha256" not in listed.stdout and "whsec_" not in listed.stdout
    rotated = harness(env, "tenant", "--file", str(path), "rotate", "acme")
    assert rotated.returncode == 0 and rotated.stdout.splitlines()[1] != key
    revoked = harness(env, "tenant", "--file", str(path), "revoke", "acme")
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    listed = harness(env, "tenant", "--file", str(path), "list")
    assert "acme  revoked" in listed.stdout
    unknown = harness(env, "tenant", "--file", str(path), "revoke", "nobody")
    assert unknown.returncode == 2


@pytest.mark.celery
def test_run_labels_are_listed_with_harness_list(env: Env) -> None:
    made = []
    for team in ("blue", "red", "blue"):
        started = harness(
            env, "run", "stdio-json", "hi", "--executable", DEMO, "--label", f"team={team}"
        )
        assert started.returncode == 0, started.stderr
        made.append(started.stdout.split()[0])
    listed = harness(env, "list", "--label", "team=blue", "--json")
    assert listed.returncode == 0, listed.stderr
    runs = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["run_id"] for r in runs] == [made[2], made[0]]
    assert all(r["labels"] == {"team": "blue"} for r in runs)
    text = harness(env, "list", "--limit", "1")
    assert text.stdout.startswith(made[2]) and "more: --cursor" in text.stdout
    bad = harness(env, "run", "stdio-json", "hi", "--executable", DEMO, "--label", "nolabel")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


def test_harness_api_serves_on_the_procfile_line(env: Env, tmp_path: Path) -> None:
    procfile = (ROOT / "Procfile").read_text()
    assert "api: harness api --host 127.0.0.1 --port 8080" in procfile
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, **env.vars, "HARNESS_TENANTS_FILE": str(tmp_path / "t.json")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert health.json() == {"ok": True}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/runs").status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
