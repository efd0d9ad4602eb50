"""Settings: HARNESS_ variables, config/.env.example in sync, readable errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from config.harnesses import DEFAULT_GRANTS, DEFAULT_IMAGES
from config.settings import Settings, SettingsError, load_settings

pytestmark = pytest.mark.usefixtures("shipped_settings")

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / ".env.example"
ASSIGNMENT = re.compile(r"^(#\s*)?(HARNESS_[A-Z0-9_]+)=(.*)$")
# Defaults that no literal value can state: they depend on the host or mean "unset".
COMMENTED_OUT = {"HARNESS_HOST_QUEUE", "HARNESS_DOCKER_URL"}


def _example() -> tuple[dict[str, str], set[str], list[str]]:
    """Active assignments, commented-out names, and the file's lines."""
    active: dict[str, str] = {}
    commented: set[str] = set()
    lines = EXAMPLE.read_text().splitlines()
    for line in lines:
        match = ASSIGNMENT.match(line)
        if not match:
            continue
        name = match.group(2)
        assert name not in active and name not in commented, f"{name} listed twice"
        if match.group(1):
            commented.add(name)
        else:
            active[name] = match.group(3)
    return active, commented, lines


def _env_name(field: str) -> str:
    return f"HARNESS_{field.upper()}"


def _default(field: str) -> Any:
    return Settings.model_fields[field].get_default(call_default_factory=True)


def test_env_example_lists_every_setting_once() -> None:
    active, commented, _ = _example()
    fields = {_env_name(name) for name in Settings.model_fields}
    assert set(active) | commented == fields
    assert commented == COMMENTED_OUT


def test_env_example_has_comment_above_each_variable() -> None:
    _, _, lines = _example()
    for index, line in enumerate(lines):
        match = ASSIGNMENT.match(line)
        if not match:
            continue
        above = lines[index - 1] if index else ""
        assert above.startswith("# ") and not ASSIGNMENT.match(above), (
            f"{match.group(2)} needs a comment line above it in config/.env.example"
        )


def test_env_example_values_load_as_defaults() -> None:
    active, _, _ = _example()
    loaded = load_settings(_env_file=str(EXAMPLE))
    for field in Settings.model_fields:
        if _env_name(field) in active:
            assert getattr(loaded, field) == _default(field), (
                f"{_env_name(field)} in config/.env.example is not the default"
            )
    assert loaded == load_settings()


def test_env_example_values_load_as_defaults_from_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    active, _, _ = _example()
    defaults = load_settings()
    for name, value in active.items():
        monkeypatch.setenv(name, value)
    assert load_settings() == defaults


def test_settings_read_from_environment_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_KEY_PREFIX", "hw-test")
    monkeypatch.setenv("HARNESS_SANDBOX", "local")
    monkeypatch.setenv("HARNESS_TURN_TIMEOUT_S", "12.5")
    settings = load_settings()
    assert (settings.key_prefix, settings.sandbox, settings.turn_timeout_s) == (
        "hw-test",
        "local",
        12.5,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HARNESS_CPUS", "lots"),
        ("HARNESS_PIDS", "0"),
        ("HARNESS_SANDBOX", "vm"),
        ("HARNESS_NETWORK", "everything"),
        ("HARNESS_KEY_PREFIX", "bad prefix"),
        ("HARNESS_MEMORY", "2 gigs"),
        ("HARNESS_CONTAINER_USER", "root"),
        ("HARNESS_IMAGES", "claude-code"),
        ("HARNESS_GRANTS", "=ANTHROPIC_API_KEY"),
        ("HARNESS_MAX_LINE_BYTES", "10"),
        ("HARNESS_CONCURRENCY", "-1"),
    ],
)
def test_invalid_value_fails_naming_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value)


def test_invalid_override_fails_naming_variable() -> None:
    with pytest.raises(SettingsError, match="HARNESS_STREAM_MAXLEN"):
        load_settings(stream_maxlen=0)


def test_turn_timeout_over_ceiling_fails_naming_both() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(turn_timeout_s=100, max_turn_timeout_s=50)
    assert "HARNESS_TURN_TIMEOUT_S" in str(caught.value)
    assert "HARNESS_MAX_TURN_TIMEOUT_S" in str(caught.value)


def test_comma_lists_parse_from_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ALLOWED_NETWORKS", " none , host,,")
    monkeypatch.setenv("HARNESS_ALLOWED_EXECUTABLES", "*")
    monkeypatch.setenv("HARNESS_ALLOWED_IMAGES", "")
    monkeypatch.setenv("HARNESS_HARNESS_QUEUES", "codex,pi")
    settings = load_settings()
    assert settings.allowed_networks == ("none", "host")
    assert settings.allowed_executables == ("*",)
    assert settings.allowed_images == ()
    assert settings.harness_queues == ("codex", "pi")


def test_comma_lists_accept_tuples_when_passed_directly() -> None:
    settings = load_settings(allowed_executables=("/bin/a", "/bin/b"))
    assert settings.allowed_executables == ("/bin/a", "/bin/b")


def test_images_map_parses_and_keeps_unnamed_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_IMAGES", "codex=registry.local:5000/codex:2, pi = pi:3")
    settings = load_settings()
    assert settings.images["codex"] == "registry.local:5000/codex:2"
    assert settings.images["pi"] == "pi:3"
    assert settings.images["gemini"] == DEFAULT_IMAGES["gemini"]
    assert settings.image_for("stdio-json") == DEFAULT_IMAGES["stdio-json"]
    assert settings.image_for("nope") is None


def test_grants_map_parses_from_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_GRANTS", "codex=OPENAI_API_KEY|EXTRA_KEY; stdio-json=*;pi=")
    settings = load_settings()
    assert settings.grants["codex"] == ("OPENAI_API_KEY", "EXTRA_KEY")
    assert settings.grants["stdio-json"] == ("*",)
    assert settings.grants["pi"] == ()


def test_grants_default_per_harness() -> None:
    assert load_settings().grants == DEFAULT_GRANTS


def test_broker_visibility_timeout_above_longest_turn_when_unset() -> None:
    settings = load_settings(max_turn_timeout_s=100, turn_timeout_s=50, shutdown_grace_s=5)
    assert settings.broker_visibility_timeout_s > 105


def test_broker_visibility_timeout_as_set_when_set() -> None:
    assert load_settings(visibility_timeout_s=42).broker_visibility_timeout_s == 42
