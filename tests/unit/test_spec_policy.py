"""What a producer may ask for: RunOptions validation and the operator's policy."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from config import Settings, load_settings
from worker.errors import InvalidInput
from worker.options.policy import check_input, resolve, resolve_secrets
from worker.options.spec import RunOptions, TurnPayload, check_run_id, new_run_id, parse_options

pytestmark = pytest.mark.usefixtures("shipped_settings")


def _settings(**overrides: Any) -> Settings:
    return load_settings(**overrides)


def _options(**fields: Any) -> RunOptions:
    fields.setdefault("harness", "claude-code")
    return RunOptions(**fields)


def _demo(**fields: Any) -> RunOptions:
    return RunOptions(harness="stdio-json", executable="harness-demo", **fields)


# --- RunOptions ------------------------------------------------------------------------------


def test_run_options_defaults() -> None:
    options = _options()
    assert options.posture == "auto"
    assert options.grants == ()
    assert options.sandbox is None and options.image is None and options.network is None


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini", "opencode", "pi"])
def test_run_options_accepts_known_harness(harness: str) -> None:
    assert RunOptions(harness=harness).harness == harness


def test_run_options_refuses_unknown_harness() -> None:
    with pytest.raises(ValidationError, match="unknown harness"):
        RunOptions(harness="cursor")


def test_parse_options_raises_invalid_input_naming_field() -> None:
    with pytest.raises(InvalidInput, match="harness: unknown harness 'cursor'"):
        parse_options(harness="cursor")


def test_run_options_refuses_unknown_field() -> None:
    with pytest.raises(ValidationError):
        RunOptions(harness="pi", privileged=True)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["ANTHROPIC_API_KEY", "_X", "a1"])
def test_grant_names_accepted_when_env_names(name: str) -> None:
    assert _options(grants=(name,)).grants == (name,)


@pytest.mark.parametrize("name", ["BAD-NAME", "1ABC", "", "A B", "A=B", "PATH;rm", "X" * 200])
def test_grant_names_refused_when_not_env_names(name: str) -> None:
    with pytest.raises(ValidationError, match="grant name"):
        _options(grants=(name,))


@pytest.mark.parametrize(
    "image",
    [
        "harness-worker/clis:1",
        "alpine",
        "registry.local:5000/team/harness:v1.2-rc",
        "ghcr.io/org/img@sha256:" + "a" * 64,
        "img:tag@sha256:" + "0" * 64,
    ],
)
def test_image_refs_accepted_when_docker_references(image: str) -> None:
    assert _options(image=image).image == image


@pytest.mark.parametrize(
    "image",
    [
        "Upper/Case",
        "has space",
        "-leading",
        "img:",
        "a//b",
        "img@sha256:short",
        "img;rm -rf /",
        "--privileged",
        "a" * 256,
    ],
)
def test_image_refs_refused_when_malformed(image: str) -> None:
    with pytest.raises(ValidationError, match="image"):
        _options(image=image)


@pytest.mark.parametrize("session", ["abc", "0199-ab_cd.ef:gh", "a" * 200])
def test_session_ids_accepted_when_plain(session: str) -> None:
    assert _options(resume_session=session).resume_session == session


@pytest.mark.parametrize("session", ["", "a b", "../x", "x/y", "a\nb", "a" * 201, "$(id)"])
def test_session_ids_refused_when_odd(session: str) -> None:
    with pytest.raises(ValidationError, match="session"):
        _options(resume_session=session)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/v1", "https://api.example.com", "https://gw.local/a/b?x=1"]
)
def test_base_urls_accepted_when_http(url: str) -> None:
    assert _options(base_url=url).base_url == url


@pytest.mark.parametrize(
    "url",
    ["ftp://x", "http://", "http://a b", "javascript:alert(1)", "localhost:8080", "http:///p"],
)
def test_base_urls_refused_when_not_http_urls(url: str) -> None:
    with pytest.raises(ValidationError, match="base URL"):
        _options(base_url=url)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", "gpt\x01"),
        ("model", "gpt\n5"),
        ("model", "   "),
        ("model", "a\x00b"),
        ("system_prompt", "be nice\x00"),
        ("executable", "/bin/demo\x00"),
        ("executable", "/bin/demo\n"),
        ("base_url", "http://x/\x00"),
        ("allow", ("Bash(ls)\n",)),
        ("deny", ("Edit\x1b",)),
        ("allow", ("",)),
    ],
)
def test_control_characters_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        _options(**{field: value})


def test_system_prompt_keeps_newlines_and_tabs() -> None:
    assert _options(system_prompt="line 1\n\tline 2").system_prompt == "line 1\n\tline 2"


@pytest.mark.parametrize("workspace", ["../up", "a/b", ".hidden", ""])
def test_workspace_names_refused_when_not_plain(workspace: str) -> None:
    with pytest.raises(ValidationError):
        _options(workspace=workspace)


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        _options(timeout_s=0)


def test_new_run_id_checks_and_differs() -> None:
    first, second = new_run_id(), new_run_id()
    assert check_run_id(first) == first
    assert first != second


@pytest.mark.parametrize("run_id", ["r123", "R" + "a" * 24, "r" + "g" * 24, "../r", ""])
def test_check_run_id_refuses_malformed(run_id: str) -> None:
    with pytest.raises(InvalidInput):
        check_run_id(run_id)


def test_turn_payload_validates_run_id_and_turn() -> None:
    run_id = new_run_id()
    assert TurnPayload(run_id=run_id, turn=1, input="x").turn == 1
    with pytest.raises(ValidationError):
        TurnPayload(run_id="../etc", turn=1, input="x")
    with pytest.raises(ValidationError):
        TurnPayload(run_id=run_id, turn=0, input="x")


# --- policy.resolve --------------------------------------------------------------------------


def test_resolve_uses_configured_defaults() -> None:
    resolved = resolve(_options(), _settings())
    assert resolved.sandbox == "docker"
    assert resolved.image == "harness-worker/clis:1"
    assert resolved.network == "bridge"
    assert resolved.timeout_s == 1800.0
    assert resolved.executable is None


def test_resolve_takes_producer_choices_within_policy() -> None:
    settings = _settings(
        allowed_networks=("none", "host"), network="none", allowed_sandboxes=("local",)
    )
    resolved = resolve(_options(sandbox="local", network="host", timeout_s=60), settings)
    assert (resolved.sandbox, resolved.network, resolved.timeout_s) == ("local", "host", 60)


def test_resolve_refuses_image_not_allowed() -> None:
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_IMAGES"):
        resolve(_options(image="evil/miner:1"), _settings())


def test_resolve_accepts_configured_image_when_named() -> None:
    assert resolve(_options(image="harness-worker/clis:1"), _settings()).image == (
        "harness-worker/clis:1"
    )


@pytest.mark.parametrize("allowed", [("my/img:2",), ("*",)])
def test_resolve_accepts_image_when_allowed(allowed: tuple[str, ...]) -> None:
    settings = _settings(allowed_images=allowed)
    assert resolve(_options(image="my/img:2"), settings).image == "my/img:2"


def test_resolve_refuses_docker_run_without_image() -> None:
    settings = _settings(images="codex=x:1")
    settings = settings.model_copy(update={"images": {}})
    with pytest.raises(InvalidInput, match="HARNESS_IMAGES"):
        resolve(_options(harness="codex"), settings)


def test_resolve_refuses_network_not_allowed() -> None:
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_NETWORKS"):
        resolve(_options(network="host"), _settings())


def test_resolve_refuses_configured_network_not_allowed() -> None:
    settings = _settings(network="host")
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_NETWORKS"):
        resolve(_options(), settings)


def test_resolve_requires_executable_for_stdio_json() -> None:
    with pytest.raises(InvalidInput, match="--executable"):
        resolve(RunOptions(harness="stdio-json"), _settings())


def test_resolve_refuses_executable_not_in_allowed_list() -> None:
    options = RunOptions(harness="stdio-json", executable="/usr/bin/python3")
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_EXECUTABLES"):
        resolve(options, _settings())


def test_resolve_accepts_executable_from_allowed_list() -> None:
    assert resolve(_demo(), _settings()).executable == "harness-demo"
    options = RunOptions(harness="stdio-json", executable="/opt/h")
    assert resolve(options, _settings(allowed_executables=("*",))).executable == "/opt/h"


def test_resolve_refuses_executable_for_other_harnesses() -> None:
    settings = _settings(allowed_executables=("*",))
    with pytest.raises(InvalidInput, match="only accepted for the stdio-json"):
        resolve(_options(executable="/bin/sh"), settings)


def test_resolve_refuses_grant_not_allowed_for_harness() -> None:
    with pytest.raises(InvalidInput, match="HARNESS_GRANTS"):
        resolve(_options(grants=("DEMO_TOKEN",)), _settings())
    with pytest.raises(InvalidInput, match="HARNESS_GRANTS"):
        resolve(_demo(grants=("ANTHROPIC_API_KEY",)), _settings())


def test_resolve_accepts_grants_allowed_for_harness() -> None:
    resolve(_options(grants=("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")), _settings())
    resolve(_demo(grants=("ANYTHING",)), _settings(grants="stdio-json=*"))


def test_resolve_refuses_timeout_over_ceiling() -> None:
    settings = _settings(max_turn_timeout_s=100, turn_timeout_s=50)
    with pytest.raises(InvalidInput, match="HARNESS_MAX_TURN_TIMEOUT_S"):
        resolve(_options(timeout_s=101), settings)
    assert resolve(_options(timeout_s=100), settings).timeout_s == 100


# --- check_input -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_check_input_refuses_empty(text: str) -> None:
    with pytest.raises(InvalidInput, match="empty"):
        check_input(text, _settings())


def test_check_input_refuses_nul() -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        check_input("hello\x00world", _settings())


def test_check_input_counts_utf8_bytes_against_limit() -> None:
    settings = _settings(max_input_bytes=10)
    check_input("a" * 10, settings)
    check_input("é" * 5, settings)  # 10 bytes
    with pytest.raises(InvalidInput, match="HARNESS_MAX_INPUT_BYTES"):
        check_input("é" * 6, settings)  # 6 characters, 12 bytes
    with pytest.raises(InvalidInput, match="HARNESS_MAX_INPUT_BYTES"):
        check_input("a" * 11, settings)


def test_check_input_accepts_one_mebibyte_by_default() -> None:
    check_input("x" * (1024 * 1024), _settings())


# --- resolve_secrets -------------------------------------------------------------------------


def test_resolve_secrets_from_allowed_and_present_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-asked-for")
    secrets = resolve_secrets(_options(grants=("ANTHROPIC_API_KEY",)), _settings())
    assert secrets == {"ANTHROPIC_API_KEY": "sk-ant-123"}


def test_resolve_secrets_empty_when_nothing_granted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-123")
    assert resolve_secrets(_options(), _settings()) == {}


def test_resolve_secrets_refuses_name_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME_SECRET", "x")
    with pytest.raises(InvalidInput, match="not allowed"):
        resolve_secrets(_options(grants=("HOME_SECRET",)), _settings())


def test_resolve_secrets_refuses_absent_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(InvalidInput, match="not available"):
        resolve_secrets(_options(grants=("ANTHROPIC_API_KEY",)), _settings())


def test_resolve_secrets_any_name_when_harness_grants_star(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUSTOM_TOKEN", "tok-1")
    settings = _settings(grants="stdio-json=*")
    assert resolve_secrets(_demo(grants=("CUSTOM_TOKEN",)), settings) == {"CUSTOM_TOKEN": "tok-1"}


@pytest.mark.parametrize(
    "field",
    [{"allow": ["ls", "\ud800"]}, {"system_prompt": "be \udcff brief"}, {"model": "m\ud800"}],
)
def test_run_options_refuse_a_lone_surrogate_naming_the_field(field: dict[str, Any]) -> None:
    # No UTF-8 exists for it: it could reach neither the run record nor a broker message.
    with pytest.raises(InvalidInput, match=f"{next(iter(field))}.*lone surrogate"):
        parse_options(harness="stdio-json", **field)
