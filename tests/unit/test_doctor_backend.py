"""``harness doctor`` checks the sandbox that runs turns: it builds the docker backend only
through the runtime's factory (``worker.runtime.make_sandbox``), configured as a worker's is,
never a second one of its own; and it finds the CLI version pins it compares images with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config import Settings, load_settings
from sandbox.base import Sandbox
from worker import runtime
from worker.cli import doctor


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return load_settings(
        workspace_root=str(tmp_path / "ws"),
        docker_url="unix:///nonexistent/docker.sock",
        key_prefix="tdoctor",
        **overrides,
    )


def test_doctor_builds_the_docker_backend_through_the_runtime_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    real = runtime.make_sandbox

    def make_sandbox(backend: str, settings: Settings) -> Sandbox:
        asked.append(backend)
        return real(backend, settings)

    monkeypatch.setattr(runtime, "make_sandbox", make_sandbox)
    (check,) = [c for c in doctor._docker(_settings(tmp_path)) if c.name == "docker"]
    assert not check.ok  # no daemon at that socket: said, not raised
    doctor.egress_check(_settings(tmp_path, network="egress"))
    assert asked == ["docker", "docker"]


def test_the_backend_doctor_checks_is_configured_as_a_workers(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    checked = doctor._docker_backend(settings)
    worker = runtime.make_sandbox("docker", settings)
    assert type(checked) is type(worker)
    assert vars(checked)["scope"] == vars(worker)["scope"] == "tdoctor"
    assert checked.egress is not None  # the gateway a worker's backend has


def test_doctor_names_no_sandbox_class_itself() -> None:
    source = Path(doctor.__file__).read_text()
    assert "DockerSandbox" not in source
    assert "LocalSandbox" not in source


def test_doctor_finds_the_cli_version_pins() -> None:
    assert doctor.PINS_FILE.is_file()
    assert doctor._repo_pins()
