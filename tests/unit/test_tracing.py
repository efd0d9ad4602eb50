"""Traces off and costless unless configured; what a harness's exec gets for telemetry."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from typing import Any

import pytest

from config import Settings, load_settings
from tests.conftest import ROOT
from worker.observe import harness_telemetry, tracing
from worker.options.policy import egress_allowlist

pytestmark = pytest.mark.usefixtures("shipped_settings")


def _settings(**overrides: Any) -> Settings:
    return load_settings(**overrides)


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_configured_only_by_an_otlp_endpoint_and_not_disabled(
    environ: dict[str, str], on: bool
) -> None:
    assert tracing.configured(environ) is on


def test_no_sdk_exporter_or_instrumentation_is_imported_when_tracing_is_off() -> None:
    # The API alone may be (the MCP SDK imports it); what costs is never loaded.
    probe = (
        "import sys\n"
        "from worker.client import HarnessClient\n"
        "from worker.turn import execute\n"
        "from worker.observe import tracing\n"
        "assert tracing.setup() is False\n"
        "with tracing.span('x') as s, tracing.tool_span('srv', 'tool', 'c1') as t:\n"
        "    assert s is t is tracing.NO_SPAN\n"
        "assert tracing.harness_env() == {} and tracing.trace_id() is None\n"
        "heavy = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.instrumentation')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_provider_name_from_the_harness_or_the_model_prefix() -> None:
    assert tracing.provider_name("claude-code", None) == "anthropic"
    assert tracing.provider_name("codex", "gpt-5") == "openai"
    assert tracing.provider_name("opencode", "anthropic/claude-sonnet") == "anthropic"
    assert tracing.provider_name("pi", None) is None


def test_exec_gets_no_telemetry_of_the_cli_unless_the_operator_turns_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    telemetry = harness_telemetry.for_turn("claude-code", _settings())
    assert telemetry == harness_telemetry.ExecTelemetry()
    assert egress_allowlist(_settings(), "claude-code", None) == egress_allowlist(
        _settings(harness_telemetry=False), "claude-code", None
    )


def test_claude_code_exports_to_the_collector_without_prompts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    env, _ = harness_telemetry.for_turn("claude-code", _settings(harness_telemetry=True)).apply(
        {"DISABLE_AUTOUPDATER": "1"}, {}
    )
    assert env["CLAUDE_CODE_ENABLE_TELEMETRY"] == "1"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["DISABLE_AUTOUPDATER"] == "1"
    assert "OTEL_LOG_USER_PROMPTS" not in env
    opted_in = harness_telemetry.for_turn(
        "claude-code", _settings(harness_telemetry=True, harness_telemetry_prompts=True)
    )
    assert opted_in.env["OTEL_LOG_USER_PROMPTS"] == "1"


def test_gemini_is_told_not_to_log_prompts_unless_opted_in() -> None:
    settings = _settings(harness_telemetry=True, harness_telemetry_endpoint="http://c:4318")
    env = harness_telemetry.for_turn("gemini", settings).env
    assert env["GEMINI_TELEMETRY_ENABLED"] == "true"
    assert env["GEMINI_TELEMETRY_OTLP_ENDPOINT"] == "http://c:4318"
    assert env["GEMINI_TELEMETRY_LOG_PROMPTS"] == "false"


def test_codex_config_gets_an_otel_table_that_parses_as_toml() -> None:
    settings = _settings(harness_telemetry=True, harness_telemetry_endpoint="http://c:4318")
    config = "/home/u/.codex/config.toml"
    original = 'sandbox_mode = "read-only"\n\n[model_providers.harness]\nname = "harness"\n'
    env, files = harness_telemetry.for_turn("codex", settings).apply(
        {"A": "1"}, {config: original, "/home/u/other": "x"}
    )
    parsed = tomllib.loads(files[config])
    assert parsed["sandbox_mode"] == "read-only"
    assert parsed["model_providers"]["harness"]["name"] == "harness"
    assert parsed["otel"]["log_user_prompt"] is False
    assert parsed["otel"]["exporter"]["otlp-http"]["endpoint"] == "http://c:4318/v1/logs"
    assert parsed["otel"]["trace_exporter"]["otlp-http"]["endpoint"] == "http://c:4318/v1/traces"
    assert files["/home/u/other"] == "x" and env == {"A": "1"}


def test_harness_without_telemetry_of_its_own_gets_nothing_but_the_trace() -> None:
    settings = _settings(harness_telemetry=True, harness_telemetry_endpoint="http://c:4318")
    assert harness_telemetry.for_turn("pi", settings) == harness_telemetry.ExecTelemetry()


def test_collector_is_allowed_through_the_egress_gateway_while_telemetry_is_on() -> None:
    settings = _settings(
        harness_telemetry=True, harness_telemetry_endpoint="https://otel.example.com"
    )
    assert "otel.example.com:443" in egress_allowlist(settings, "claude-code", None)
    off = _settings(harness_telemetry_endpoint="https://otel.example.com")
    assert "otel.example.com:443" not in egress_allowlist(off, "claude-code", None)


def test_the_harness_gets_traceparent_and_tracestate_of_the_current_span() -> None:
    probe = (
        "from opentelemetry import propagate\n"
        "from worker.observe import tracing\n"
        "assert tracing.setup()\n"
        "ctx = propagate.extract({'traceparent': "
        "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'tracestate': 'acme=7'})\n"
        "with tracing.span('turn', parent=ctx):\n"
        "    env = tracing.harness_env()\n"
        "    print(env['TRACEPARENT'].split('-')[1], env['TRACESTATE'], tracing.trace_id())\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(ROOT),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_TRACES_SAMPLER": "always_off",  # nothing to export to the closed port
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert done.stdout.split() == [trace, "acme=7", trace]
