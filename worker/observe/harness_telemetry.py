"""What a turn's harness process gets for observability: ``TRACEPARENT``/``TRACESTATE`` of
its turn's span (while the worker traces), and, when the operator turns it on
(``HARNESS_HARNESS_TELEMETRY``), the switches of the CLI's own OpenTelemetry pointed at the
operator's collector.

Each CLI has its own switches; prompt text is exported by none of them unless the operator
opts in (``HARNESS_HARNESS_TELEMETRY_PROMPTS``). Harnesses without OpenTelemetry of their
own (opencode, pi, stdio-json) get only the trace context. Nothing here is secret: the
collector's headers (``OTEL_EXPORTER_OTLP_HEADERS``, often a key) stay with the worker, so
a collector the sandbox reaches must accept the harness's telemetry without them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from config import Settings
from worker.observe import tracing
from worker.options.policy import collector_url

CODEX_CONFIG = "/.codex/config.toml"


@dataclass(frozen=True)
class ExecTelemetry:
    """Environment added to a harness's exec, and a table appended to Codex's config."""

    env: dict[str, str] = field(default_factory=dict)
    codex_otel: str = ""

    def apply(
        self, env: Mapping[str, str], files: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The command's env and files with this telemetry in (ours win over the adapter's)."""
        merged_files = dict(files)
        if self.codex_otel:
            for path, text in files.items():
                if path.endswith(CODEX_CONFIG):
                    merged_files[path] = f"{text.rstrip()}\n\n{self.codex_otel}"
        return {**env, **self.env}, merged_files


def for_turn(harness: str, settings: Settings) -> ExecTelemetry:
    """The exec's telemetry for a turn of ``harness``, in the current (turn's) span."""
    env = tracing.harness_env()
    url = collector_url(settings)
    if url is None:
        return ExecTelemetry(env)
    prompts = settings.harness_telemetry_prompts
    if harness == "claude-code":
        env.update(_claude_code(url, prompts))
    elif harness == "gemini":
        env.update(_gemini(url, prompts))
    elif harness == "codex":
        return ExecTelemetry(env, _codex(url, prompts))
    return ExecTelemetry(env)


def _claude_code(url: str, prompts: bool) -> dict[str, str]:
    # Claude Code's monitoring variables (its "Monitoring" docs, 2.x): metrics and events
    # (logs) over OTLP; spans too with the enhanced-telemetry beta, parented by TRACEPARENT.
    env = {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
    }
    if prompts:
        env["OTEL_LOG_USER_PROMPTS"] = "1"  # redacted by Claude Code unless set
    return env


def _gemini(url: str, prompts: bool) -> dict[str, str]:
    # Gemini CLI's telemetry settings as environment (its documentation, "Telemetry"): target
    # "local" with an OTLP endpoint exports there; logPrompts defaults to true, so it is
    # always said.
    return {
        "GEMINI_TELEMETRY_ENABLED": "true",
        "GEMINI_TELEMETRY_TARGET": "local",
        "GEMINI_TELEMETRY_OTLP_ENDPOINT": url,
        "GEMINI_TELEMETRY_OTLP_PROTOCOL": "http",
        "GEMINI_TELEMETRY_TRACES_ENABLED": "true",
        "GEMINI_TELEMETRY_LOG_PROMPTS": "true" if prompts else "false",
    }


def _codex(url: str, prompts: bool) -> str:
    # Codex reads its OpenTelemetry from config.toml only ([otel], its configuration reference):
    # events (logs) and spans over OTLP/HTTP protobuf ("binary").
    logs, traces = json.dumps(f"{url}/v1/logs"), json.dumps(f"{url}/v1/traces")
    return "\n".join(
        [
            "[otel]",
            f"log_user_prompt = {'true' if prompts else 'false'}",
            f'exporter = {{ otlp-http = {{ endpoint = {logs}, protocol = "binary" }} }}',
            f'trace_exporter = {{ otlp-http = {{ endpoint = {traces}, protocol = "binary" }} }}',
            "",
        ]
    )
