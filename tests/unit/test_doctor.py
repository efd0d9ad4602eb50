"""`harness doctor`: every problem found with its fix, exit 1 when something is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from worker import doctor
from worker.doctor import Check, collect, mask_url, run_doctor, settings_checks

CLOSED = "redis://:sekrit-pw@127.0.0.1:1/0"
NO_DAEMON = "unix:///nonexistent/docker.sock"
GIB = 1024**3


def settings(tmp_path: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "redis_url": CLOSED,
        "broker_url": CLOSED,
        "docker_url": NO_DAEMON,
        "workspace_root": str(tmp_path),
    }
    values.update(overrides)
    return load_settings(**values)


def doctor_json(capsys: pytest.CaptureFixture[str], checks: list[Check]) -> tuple[int, Any]:
    code = run_doctor(json_output=True, check=lambda: checks)
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1  # one object, nothing else
    return code, json.loads(out)


def test_nothing_reachable_fails_with_a_fix_for_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = doctor_json(capsys, collect(settings(tmp_path)))
    assert code == 1 and report["ok"] is False
    failed = {c["name"]: c for c in report["checks"] if c["level"] == "fail"}
    assert {"redis", "broker", "docker"} <= set(failed)
    for check in failed.values():
        assert check["ok"] is False
        assert check["fix"] and "\n" not in check["fix"]
    assert "HARNESS_REDIS_URL" in failed["redis"]["fix"]
    assert "dockerd" in failed["docker"]["fix"]


def test_passwords_never_appear_in_either_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checks = collect(settings(tmp_path, broker_url="amqp://guest:sekrit-pw@127.0.0.1:1//"))
    run_doctor(json_output=True, check=lambda: checks)
    run_doctor(json_output=False, check=lambda: checks)
    out = capsys.readouterr().out
    assert "sekrit-pw" not in out
    assert "redis://:***@127.0.0.1:1/0" in out


def test_human_output_marks_failures_and_gives_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_doctor(check=lambda: collect(settings(tmp_path)))
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    redis_at = next(i for i, line in enumerate(lines) if line.startswith("✗ redis"))
    assert lines[redis_at + 1].strip().startswith("→ start Redis")
    assert lines[-1].startswith("3 failed")


def test_warnings_alone_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    checks = [Check("redis", True, "ok"), doctor.warn("setting X", "odd", "change it")]
    code, report = doctor_json(capsys, checks)
    assert code == 0 and report["ok"] is True
    assert [c["level"] for c in report["checks"]] == ["ok", "warn"]


def test_capabilities_of_every_harness_are_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = doctor_json(capsys, [Check("redis", True, "ok")])
    assert set(report["capabilities"]) == {
        "claude-code",
        "codex",
        "gemini",
        "opencode",
        "pi",
        "stdio-json",
    }
    assert report["capabilities"]["stdio-json"]["permission_policy"] == "none"


def test_local_sandbox_does_not_need_docker(tmp_path: Path) -> None:
    (docker,) = [c for c in collect(settings(tmp_path, sandbox="local")) if c.name == "docker"]
    assert docker.ok and docker.detail.startswith("not used")


def test_docker_backend_needs_docker(tmp_path: Path) -> None:
    (docker,) = [c for c in collect(settings(tmp_path)) if c.name == "docker"]
    assert not docker.ok and docker.level == "fail"


def levels(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.level for c in checks}


def test_default_settings_look_fine(tmp_path: Path) -> None:
    checks = settings_checks(
        settings(
            tmp_path, redis_url="redis://127.0.0.1:6379/0", broker_url="redis://127.0.0.1:6379/0"
        ),
        64 * GIB,
    )
    assert levels(checks) == {"settings": "ok"}


def test_visibility_timeout_shorter_than_a_turn_fails(tmp_path: Path) -> None:
    checks = settings_checks(settings(tmp_path, visibility_timeout_s=600), 64 * GIB)
    assert levels(checks)["setting HARNESS_VISIBILITY_TIMEOUT_S"] == "fail"
    assert not all(c.ok for c in checks)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"allowed_networks": "none,bridge,host"}, "setting HARNESS_ALLOWED_NETWORKS"),
        ({"allowed_executables": "*"}, "setting HARNESS_ALLOWED_EXECUTABLES"),
        ({"allowed_images": "*"}, "setting HARNESS_ALLOWED_IMAGES"),
        ({"sandbox": "local"}, "setting HARNESS_SANDBOX"),
        ({"allowed_sandboxes": "local"}, "setting HARNESS_ALLOWED_SANDBOXES"),
        ({"container_user": "0:0"}, "setting HARNESS_CONTAINER_USER"),
        ({"read_only_root": False}, "setting HARNESS_READ_ONLY_ROOT"),
        ({"idle_timeout_s": 1800}, "setting HARNESS_IDLE_TIMEOUT_S"),
        ({"pool": "prefork"}, "setting HARNESS_POOL"),
        ({"redis_url": "redis://10.0.0.5:6379/0"}, "setting HARNESS_REDIS_URL"),
        ({"broker_url": "amqp://10.0.0.5:5672//"}, "setting HARNESS_BROKER_URL"),
        ({"docker_url": "tcp://10.0.0.5:2375"}, "setting HARNESS_DOCKER_URL"),
        ({"memory": "16g"}, "setting HARNESS_MEMORY"),
    ],
)
def test_risky_setting_is_a_warning_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], name: str
) -> None:
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    base = {"redis_url": "redis://127.0.0.1:6379/0", "broker_url": "redis://127.0.0.1:6379/0"}
    checks = settings_checks(settings(tmp_path, **{**base, **overrides}), 8 * GIB)
    found = [c for c in checks if c.name == name]
    assert found, levels(checks)
    assert found[0].level == "warn" and found[0].ok and found[0].fix


def test_remote_redis_with_a_password_is_not_flagged(tmp_path: Path) -> None:
    checks = settings_checks(
        settings(
            tmp_path,
            redis_url="rediss://:pw@redis.internal:6380/0",
            broker_url="redis://127.0.0.1:6379/0",
        ),
        64 * GIB,
    )
    assert "setting HARNESS_REDIS_URL" not in levels(checks)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_mask_url_hides_only_the_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked
