"""The real CLIs call a producer's tool set through the run's MCP endpoint (the stdio bridge,
the socket in the run's HOME, the tool server on real Redis), against the fake model's
``mcp`` scenario: the model calls the attached tool, and its next request carries the result."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from adapters.events import Event, ToolCall, ToolResult
from adapters.protocol import TurnRequest
from config import load_settings
from sandbox.base import Placement
from tests.conformance.conftest import DEFAULT_SECRETS, LiveTurn, RunLiveTurn
from tests.conformance.test_permissions_live import (  # noqa: F401 (fixtures)
    RunAsked,
    _lua_in_fakeredis,
    run_asked,
)
from tests.fakemodel.scenarios import MCP_FINAL_PREFIX, MCP_SERVER, MCP_TOOL
from worker.deps import Shutdown, TurnDeps
from worker.observe.masking import Masker
from worker.options.spec import RunOptions
from worker.permissions import requests as permissions
from worker.store import credentials
from worker.store.keys import Keys, SyncRedis
from worker.tools import calls
from worker.tools import turn as turn_tools
from worker.tools.schema import tool_set

pytestmark = pytest.mark.redis

ORDER_STATUS = "order 7: shipped on 2026-11-30"
MODELS = {
    "claude-code": "claude-sonnet-4-5",
    # A model codex 0.169.0 has metadata for (gpt-5.5) gets MCP tools deferred behind its
    # tool_search; one it does not know gets them at once, a namespace per server.
    "codex": "fake-model",
    "gemini": "gemini-2.5-flash",
    "opencode": "fake-model",
    "pi": "fake-model",
}


def lookup(order_id: int) -> str:
    """Look up an order by its id: its status."""
    return ORDER_STATUS if order_id == 7 else f"no order {order_id}"


@dataclass
class Tools:
    deps: TurnDeps
    client: SyncRedis
    keys: Keys

    @contextlib.contextmanager
    def attached(
        self, harness: str, placement: Placement, **options: Any
    ) -> Iterator[tuple[TurnRequest, dict[str, str], turn_tools.TurnTools]]:
        options = {"model": MODELS[harness], **options}
        run_options = RunOptions(harness=harness, tools=(MCP_SERVER,), **options)
        token = credentials.issue(self.client, self.keys, placement.run_id, 600)
        secrets = {**DEFAULT_SECRETS[harness], "HARNESS_RUN_TOKEN": token}
        with turn_tools.serve(
            self.deps,
            placement.run_id,
            1,
            run_options,
            placement,
            Path(placement.workspace),
            Masker(secrets),
        ) as tools:
            assert tools is not None
            request = TurnRequest(
                input="[scenario:mcp] What is the status of order 7?",
                mcp_servers=tools.servers,
                **options,
            )
            yield request, secrets, tools


@pytest.fixture
def tools(redis_url: str) -> Iterator[Tools]:
    client = cast(SyncRedis, redis.Redis.from_url(redis_url, decode_responses=True))
    keys = Keys(f"live-tools-{uuid.uuid4().hex[:8]}")
    settings = load_settings(tool_call_timeout_s=30.0)
    deps = TurnDeps(
        settings=settings, redis=client, keys=keys, store=None,  # type: ignore[arg-type]
        sandbox_for=lambda backend: None,  # type: ignore[arg-type,return-value]
        worker_id="live", shutdown=Shutdown(1.0),
    )  # fmt: skip
    stop = threading.Event()
    server = calls.ToolServer(client, keys, MCP_SERVER, tool_set(lookup))
    thread = threading.Thread(target=server.serve, args=(stop,), kwargs={"block_s": 0.2})
    thread.start()
    deadline = time.monotonic() + 10
    while not client.get(keys.tool_definitions(MCP_SERVER)) and time.monotonic() < deadline:
        time.sleep(0.02)  # served: pi names the tools it may call when the turn begins
    yield Tools(deps, client, keys)
    stop.set()
    thread.join(5)
    for key in cast(redis.Redis, client).scan_iter(f"{keys.prefix}:*"):
        client.delete(key)


def assert_called_and_answered(turn: LiveTurn, events: list[Event]) -> None:
    """The tool ran once through the endpoint, the model's next request carried its result,
    and the answer used it."""
    first = turn.model_requests()[0].body or {}
    offered = [
        t if t.get("type") == "tool_search" else (t.get("type"), t.get("name"))
        for t in first.get("tools") or []
    ] or sorted(first)
    calls_made = [e for e in events if isinstance(e, ToolCall)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [(c.server, c.tool, c.input) for c in calls_made] == [
        (MCP_SERVER, MCP_TOOL, '{"order_id": 7}')
    ], f"{turn.describe()}\noffered={offered}"
    assert results and results[0].ok and results[0].output == ORDER_STATUS
    final = turn.model_requests()[-1].conversation
    assert final is not None and any(ORDER_STATUS in r for r in final.tool_results()), (
        turn.describe()
    )
    answer = turn.complete.text  # codex 0.169.0 wraps a result ("Wall time: ...\nOutput:\n...")
    assert answer.startswith(MCP_FINAL_PREFIX) and ORDER_STATUS in answer


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini", "opencode", "pi"])
def test_the_model_calls_the_attached_tool_and_answers_with_its_result(
    harness: str, tools: Tools, run_live_turn: RunLiveTurn, live_placement: Any
) -> None:
    placement = live_placement()
    with tools.attached(harness, placement) as (request, secrets, served):
        turn = run_live_turn(harness, request, placement=placement, secrets=secrets)
        events = served.drain()
    assert_called_and_answered(turn, events)


ASKED = ["claude-code", "gemini", "opencode", "pi"]
"""The CLIs that ask for MCP calls themselves (mcp_ask); codex's are asked by the endpoint."""


@pytest.mark.parametrize("harness", ASKED)
def test_under_posture_ask_the_attached_tool_is_asked_for_and_runs_once_allowed(
    harness: str,
    tools: Tools,
    run_asked: RunAsked,  # noqa: F811 (the fixture, imported above)
    live_placement: Any,
) -> None:
    placement = live_placement()
    with tools.attached(harness, placement, posture="ask") as (request, secrets, served):
        turn = run_asked(
            harness, request.input, lambda pending: (True, False), placement=placement,
            mcp_servers=request.mcp_servers, secrets=secrets,
        )  # fmt: skip
        events = served.drain()
    asked = [f"{e.tool} {e.description}" for e in turn.of_type("permission-request")]  # type: ignore[attr-defined]
    assert any(MCP_TOOL in text for text in asked), turn.events
    assert [e.type for e in events if isinstance(e, ToolResult) and e.ok] == ["tool-result"], (
        turn.events
    )
    assert turn.events[-1].type == "turn-complete", turn.events[-1]


def test_under_posture_ask_codex_calls_are_asked_by_the_endpoint(
    tools: Tools,
    run_asked: RunAsked,  # noqa: F811 (the fixture, imported above)
    live_placement: Any,
) -> None:
    """Codex 0.169.0 does not ask for MCP calls (mcp_ask false): the endpoint asks, in Redis
    like any permission request, and makes the call once it is allowed."""
    placement = live_placement()
    stop = threading.Event()
    answered: list[dict[str, Any]] = []

    def answerer() -> None:
        while not stop.is_set():
            for pending in permissions.pending(tools.client, tools.keys, placement.run_id):
                answered.append(
                    permissions.answer(
                        tools.client, tools.keys, placement.run_id, pending["request_id"],
                        allow=True, by="live-test",
                    )
                )  # fmt: skip
            stop.wait(0.05)

    thread = threading.Thread(target=answerer, daemon=True)
    thread.start()
    try:
        with tools.attached("codex", placement, posture="ask") as (request, secrets, served):
            turn = run_asked(
                "codex", request.input, lambda pending: (True, False), placement=placement,
                mcp_servers=request.mcp_servers, secrets=secrets, model=request.model,
            )  # fmt: skip
            events = served.drain()
    finally:
        stop.set()
        thread.join(5)
    asked = [e for e in events if e.type == "permission-request"]
    assert [e.tool for e in asked] == [f"mcp__{MCP_SERVER}__{MCP_TOOL}"], (  # type: ignore[attr-defined]
        events,
        [e.model_dump() for e in turn.events[1:-1]],
    )
    assert [a["by"] for a in answered] == ["live-test"]
    assert [e.ok for e in events if isinstance(e, ToolResult)] == [True], events
    assert turn.events[-1].type == "turn-complete", turn.events[-1]
