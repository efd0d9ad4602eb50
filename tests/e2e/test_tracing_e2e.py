"""The real CLIs see their turn's trace: each one, asked by the fake model to run
``printenv TRACEPARENT``, runs it inside its container with the environment it was given,
and the trace context it prints is the turn's span, which the worker exported."""

from __future__ import annotations

import re

import pytest

import tests.fakemodel.server as fake_server
from tests.e2e.conftest import HARNESSES, Deployment, Harness, nonce

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.docker,
    pytest.mark.redis,
    pytest.mark.celery,
]

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@pytest.mark.parametrize("harness", list(HARNESSES.values()), ids=list(HARNESSES))
def test_the_cli_runs_with_the_traceparent_of_its_turns_span(
    e2e: Deployment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_server, "TOOL_COMMAND", "printenv TRACEPARENT")
    word = nonce()
    followed = e2e.run(harness, f"[scenario:tool] run it {word}", "--posture", "dangerous")
    assert followed.terminal["type"] == "turn-complete", followed.describe()
    trace_id = followed.events[0]["data"]["trace_id"]
    calls = [r for r in e2e.requests(word) if r.conversation is not None]
    results = [text for r in calls for text in r.conversation.tool_results()]  # type: ignore[union-attr]
    seen = [m for text in results for m in TRACEPARENT.finditer(text)]
    assert seen, f"no TRACEPARENT in the tool's output: {results}"
    assert seen[-1].group(1) == trace_id
    span_id = seen[-1].group(2)
    assert e2e.traces is not None
    spans = e2e.traces.wait_for(lambda got: any(s.span_id == span_id for s in got))
    (turn,) = [s for s in spans if s.span_id == span_id]
    assert (turn.name, turn.trace_id) == (f"invoke_agent {harness.id}", trace_id)
    assert (
        turn.attributes["gen_ai.conversation.id"]
        == e2e.client.status(followed.run_id)["session_id"]
    )


def test_codex_loads_the_otel_table_the_worker_appends_to_its_config(clis_image_e2e: str) -> None:
    """Codex reads its telemetry from config.toml only: the table must be one it accepts (a
    table it refuses stops every turn with a config error)."""
    import docker

    from adapters import codex
    from adapters.protocol import TurnRequest
    from config import load_settings
    from worker.observe import harness_telemetry

    home = "/home/harness"
    settings = load_settings(harness_telemetry=True, harness_telemetry_endpoint="http://c:4318")
    request = TurnRequest(input="hi", workspace="/workspace", home=home)
    _, files = harness_telemetry.for_turn("codex", settings).apply(
        {}, codex.config_file(request, "read-only")
    )
    config = files[f"{home}/.codex/config.toml"]
    assert "[otel]" in config
    script = (
        'mkdir -p "$HOME/.codex" && printf %s "$CONFIG" > "$HOME/.codex/config.toml" && '
        "OPENAI_API_KEY=x timeout 20 codex exec --skip-git-repo-check hi 2>&1 | head -20"
    )
    client = docker.from_env()
    try:
        out = client.containers.run(
            clis_image_e2e,
            ["/bin/sh", "-c", script],
            entrypoint=[],
            environment={"CONFIG": config, "HOME": home},
            network_mode="none",
            remove=True,
        ).decode()
    finally:
        client.close()
    assert "Error loading config.toml" not in out, out
    assert "OpenAI Codex" in out, out
