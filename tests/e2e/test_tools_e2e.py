"""The real CLIs in their containers on network ``egress`` call a producer's tool set: the
run's endpoint reaches the sandbox through the workspace's bind mount (no route, no port),
``harness tools serve`` answers in another process, the model's next request (through the
gateway, over TLS) carries the result, and the stream shows the call before the terminal."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import HARNESSES, Deployment, Harness, nonce
from tests.fakemodel.scenarios import MCP_FINAL_PREFIX
from tests.helpers import assert_one_terminal
from tests.integration.test_tools_worker import Servers

pytestmark = [pytest.mark.conformance, pytest.mark.docker, pytest.mark.redis, pytest.mark.celery]

LOADED = ("claude-code", "codex", "gemini", "opencode", "pi")
"""Every CLI: four with an MCP client of their own, pi through the extension its adapter ships."""


@pytest.mark.parametrize("harness", [HARNESSES[h] for h in LOADED], ids=list(LOADED))
def test_a_cli_on_the_egress_network_calls_the_runs_tool(e2e: Deployment, harness: Harness) -> None:
    servers = Servers(e2e.env)
    servers.start()
    try:
        tag = nonce()
        # Codex 0.169.0 defers MCP tools behind tool_search for a model it has metadata
        # for; the fake model is one it does not know, so the tools come at once.
        extra = ("--model", "fake-model") if harness.id == "codex" else ()
        # A system prompt too: adapters write its file under HOME/.harness as the sandbox's
        # user, beside the endpoint's directory (the worker's).
        followed = e2e.run(
            harness, f"[scenario:mcp] status of order 7? {tag}", "--tools", "orders",
            "--system-prompt", "Answer briefly.", *extra,
        )  # fmt: skip
    finally:
        servers.stop()
    events = followed.events
    assert_one_terminal(events, 1)
    assert followed.terminal["type"] == "turn-complete", followed.describe()
    [call] = followed.of_type("tool-call")
    [result] = followed.of_type("tool-result")
    assert (call["server"], call["tool"], call["input"]) == ("orders", "lookup", '{"order_id": 7}')
    assert result["ok"] and result["output"] == '{"id":7,"status":"shipped"}', followed.describe()
    last = e2e.requests(tag)[-1].conversation
    assert last is not None and any("shipped" in r for r in last.tool_results()), (
        followed.describe()
    )
    assert followed.terminal["data"]["text"].startswith(MCP_FINAL_PREFIX)
    types = [e["type"] for e in events]
    assert types.index("tool-result") < len(types) - 1
