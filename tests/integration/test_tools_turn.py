"""A turn that calls the run's tools: execute_turn on the local backend, the demo harness as
the stdio-json MCP client, a tool set served from another thread over real Redis."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

import adapters
from config import load_settings
from sandbox.local import LocalSandbox
from worker.cli import render
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RunStore
from worker.tools import calls
from worker.tools.schema import tool_set
from worker.turn.execute import Shutdown, TurnDeps, execute_turn

pytestmark = pytest.mark.redis

DEMO = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"


def lookup(order_id: int) -> dict[str, Any]:
    """Look up an order."""
    return {"id": order_id, "status": "shipped"}


@dataclass
class World:
    deps: TurnDeps
    client: SyncRedis
    keys: Keys
    root: Path
    executable: str

    def run(self, **options: Any) -> str:
        options = {
            "harness": "stdio-json",
            "executable": self.executable,
            "sandbox": "local",
            **options,
        }
        run_id = new_run_id()
        self.deps.store.create(run_id, RunOptions(**options), queue="q", sandbox="local")
        return run_id

    def turn(self, run_id: str, text: str, turn: int = 1) -> str:
        return execute_turn(self.deps, TurnPayload(run_id=run_id, turn=turn, input=text))

    def events(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (f["type"], json.loads(f["data"]))
            for _, f in self.client.xrange(self.keys.events(run_id))
        ]


@pytest.fixture
def world(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for name in list(os.environ):
        if name.startswith("HARNESS_"):
            monkeypatch.delenv(name)
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    prefix = f"tt-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        sandbox="local", key_prefix=prefix, workspace_root=str(tmp_path), allowed_executables=("*",),
        exit_grace_s=1.0, kill_grace_s=0.2, tool_call_timeout_s=5.0,
        mcp_servers={"ops": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer x"}}},
    )  # fmt: skip
    client = cast(SyncRedis, redis.Redis.from_url(redis_url, decode_responses=True))
    keys = Keys(prefix)
    sandbox = LocalSandbox(tmp_path / "local")
    deps = TurnDeps(
        settings=settings, redis=client, keys=keys, store=RunStore(client, keys, settings.retention_s),
        sandbox_for=lambda backend: sandbox, worker_id="test-host:1", shutdown=Shutdown(settings.shutdown_grace_s),
    )  # fmt: skip
    stop = threading.Event()
    server = calls.ToolServer(client, keys, "orders", tool_set(lookup))
    thread = threading.Thread(target=server.serve, args=(stop,), kwargs={"block_s": 0.2})
    thread.start()
    yield World(deps, client, keys, tmp_path, str(wrapper))
    stop.set()
    thread.join(5)
    for found in sandbox.managed():
        sandbox.teardown(found.run_id)
    for key in cast(redis.Redis, client).scan_iter(f"{prefix}:*"):
        client.delete(key)


def test_a_turn_calls_a_producer_tool_and_its_events_come_before_the_terminal(world: World) -> None:
    run_id = world.run(tools=("orders",))
    assert world.turn(run_id, '@tools orders\n@tool orders lookup {"order_id": 7}') == "completed"
    events = world.events(run_id)
    types = [t for t, _ in events]
    assert types[-1] == "turn-complete"
    texts = [d["text"] for t, d in events if t == "assistant-text"]
    assert "tools orders: lookup" in texts
    assert 'tool orders.lookup ok: {"id":7,"status":"shipped"}' in texts
    [call] = [d for t, d in events if t == "tool-call"]
    [result] = [d for t, d in events if t == "tool-result"]
    assert call == {
        "call_id": "t1-1",
        "server": "orders",
        "tool": "lookup",
        "input": '{"order_id": 7}',
        "input_chars": 15,
    }
    assert (
        result["call_id"] == "t1-1"
        and result["ok"]
        and result["output"] == '{"id":7,"status":"shipped"}'
    )
    assert types.index("tool-call") < types.index("tool-result") < types.index("turn-complete")
    record = world.deps.store.record(run_id)
    assert record.tool_calls == 1  # harness status shows it
    assert ("tool_calls", "1") in render.record_rows(record.as_dict(), now=0.0)
    home = world.root / "local" / "run" / run_id / ".home"
    assert not (
        home / ".harness-endpoint" / "mcp.sock"
    ).exists()  # the endpoint lives only in its turn
    config = json.loads((home / ".harness-mcp.json").read_text())
    assert list(config["mcpServers"]) == ["orders"]
    assert (
        "HARNESS_RUN_TOKEN" not in json.dumps(config) or config["mcpServers"]["orders"]["env"] == {}
    )


def test_a_deny_pattern_refuses_an_attached_tool(world: World) -> None:
    run_id = world.run(tools=("orders",), deny=("mcp__orders__lookup",))
    world.turn(run_id, '@tool orders lookup {"order_id": 1}')
    [result] = [d for t, d in world.events(run_id) if t == "tool-result"]
    assert not result["ok"] and result["output"] == "Denied by the run's rule mcp__orders__lookup."


def test_a_run_may_attach_only_servers_the_operator_named(world: World) -> None:
    run_id = world.run(mcp=("elsewhere",))
    assert world.turn(run_id, "hello") == "failed:invalid-input"
    [(_, error)] = [(t, d) for t, d in world.events(run_id) if t == "session-error"]
    assert "not an MCP server of the operator's" in error["error"] and "ops" in error["error"]


def test_a_harness_without_an_mcp_client_is_refused_tools(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every adapter has an MCP client now: the flag is turned off to see that it matters.
    adapter = adapters.get("stdio-json")
    monkeypatch.setattr(
        adapter, "CAPABILITIES", dataclasses.replace(adapter.CAPABILITIES, mcp_client=False)
    )
    run_id = world.run(tools=("orders",))
    outcome = world.turn(run_id, "hello")
    [error] = [d for t, d in world.events(run_id) if t == "session-error"]
    assert outcome == "failed:invalid-input" and "mcp_client is false" in error["error"]
