"""The harness image from scripts/build-images: the pinned CLIs, offline, as a non-root user."""

from __future__ import annotations

import json
import re
import subprocess

import docker
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import build_lock

pytestmark = [pytest.mark.conformance, pytest.mark.docker]

PACKAGES = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
    "opencode": "opencode-ai",
    "pi": "@mariozechner/pi-coding-agent",
}


def pins() -> dict[str, str]:
    return dict(json.loads((ROOT / "docker" / "clis" / "package.json").read_text())["dependencies"])


def test_image_runs_the_pinned_clis_offline_as_a_non_root_user(clis_image_e2e: str) -> None:
    client = docker.from_env()
    try:
        assert client.images.get(clis_image_e2e).attrs["Config"]["User"] == "1000:1000"
        script = (
            'id -u; for c in "$@"; do printf "== %s " "$c"; "$c" --version 2>&1 | tail -1; done'
        )
        out = client.containers.run(
            clis_image_e2e,
            ["sh", "-c", script, "sh", *PACKAGES],
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": ""},
            environment={"HOME": "/tmp"},
            remove=True,
        ).decode()
    finally:
        client.close()
    lines = out.splitlines()
    assert lines[0] == "1000", out
    versions = {}
    for line in lines[1:]:
        match = re.match(r"== (\S+) .*?(\d+\.\d+\.\d+)", line)
        assert match, out
        versions[match.group(1)] = match.group(2)
    wanted = pins()
    assert versions == {cli: wanted[package] for cli, package in PACKAGES.items()}


def test_build_images_reuses_an_image_whose_inputs_did_not_change(clis_image_e2e: str) -> None:
    client = docker.from_env()
    try:
        before = client.images.get(clis_image_e2e).id
        with build_lock():
            done = subprocess.run(
                [str(ROOT / "scripts" / "build-images"), "--only", "clis"],
                capture_output=True,
                text=True,
                timeout=600,
            )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"reused {clis_image_e2e}" in done.stdout.splitlines(), done.stdout
        assert client.images.get(clis_image_e2e).id == before
    finally:
        client.close()
