"""A whole turn through the model gateway: execute_turn on the local backend, the demo harness
asking the fake model server (the upstream) with its granted key, real Redis.

What a user relies on: the harness holds a stand-in, the upstream gets the real key, the wire's
usage is in the stream and the record beside the harness's, a spent budget stops the turn at
the gateway, a rate limit parks it with the upstream's retry-after, a failing model falls back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakemodel import FakeModelServer
from tests.integration.in_process import turn_deps
from worker.client import HarnessClient
from worker.deps import TurnDeps
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.turn.execute import execute_turn

pytestmark = pytest.mark.redis

REAL = "sk-operator-real-key-7f3a9c"


@dataclass
class World:
    deps: TurnDeps
    client: HarnessClient
    executable: str
    fake: FakeModelServer
    root: Path

    def run(self, **options: Any) -> str:
        run_id = new_run_id()
        options = {
            "harness": "stdio-json",
            "executable": self.executable,
            "grants": ("OPENAI_API_KEY",),
            **options,
        }
        self.deps.store.create(run_id, RunOptions(**options), queue="q", sandbox="local")
        return run_id

    def turn(self, run_id: str, text: str, turn: int = 1) -> str:
        return execute_turn(self.deps, TurnPayload(run_id=run_id, turn=turn, input=text))

    def events(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        key = self.deps.keys.events(run_id)
        return [(f["type"], json.loads(f["data"])) for _, f in self.deps.redis.xrange(key)]

    def held_key(self) -> str:
        """OPENAI_API_KEY in the environment the harness's command ran with (HELD)."""
        (found,) = self.root.glob("**/held-env")
        return held_key(found)


HELD = "@run cp /proc/self/environ held-env"
"""A command of the harness's copies its environment into the workspace."""


def held_key(path: Path) -> str:
    entries = path.read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)["OPENAI_API_KEY"]


@pytest.fixture
def world(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("OPENAI_API_KEY", REAL)
    with (
        FakeModelServer() as fake,
        turn_deps(
            tmp_path,
            redis_url,
            "gw",
            grants={"stdio-json": ("OPENAI_API_KEY",)},
            model_upstreams={"stdio-json": (fake.url + "/v1",)},
        ) as (deps, client, executable),
    ):
        yield World(deps, client, executable, fake, tmp_path)


ASK = "@model OPENAI_API_KEY fake-model hello"


def test_the_harness_holds_a_stand_in_and_the_upstream_gets_the_real_key(world: World) -> None:
    run_id = world.run()
    script = f"{HELD}\n{ASK}\n@complete done"
    assert world.turn(run_id, script) == "completed"
    held = world.held_key()
    assert held.startswith("hwgw_") and REAL not in held
    (request,) = world.fake.model_requests()
    assert request.credentials == (REAL,)
    stream = json.dumps(world.events(run_id))
    assert REAL not in stream and held not in stream


def test_the_wire_usage_is_published_and_kept_beside_the_harnesss(world: World) -> None:
    world.fake.answer_model = "fake-model-2026"
    run_id = world.run()
    assert world.turn(run_id, f"{ASK}\n@complete done") == "completed"
    usages = [data for kind, data in world.events(run_id) if kind == "usage"]
    sources = sorted(u["source"] for u in usages)
    assert sources == ["gateway", "harness"]
    wire = next(u for u in usages if u["source"] == "gateway")
    harness = next(u for u in usages if u["source"] == "harness")
    assert wire["model"] == "fake-model-2026" and "model" not in harness
    record = world.deps.store.record(run_id)
    assert record.gateway_requests == 1
    assert record.gateway_input_tokens == wire["input_tokens"] > 0
    assert record.gateway_output_tokens == wire["output_tokens"] > 0
    # The harness's own report is what the record's totals always held; not added twice.
    assert record.input_tokens == harness["input_tokens"]
    assert record.model_served == "fake-model-2026"
    assert world.deps.store.begin_turn(run_id) == 2
    assert world.turn(run_id, f"{ASK}\n{ASK}\n@complete again", turn=2) == "completed"
    again = world.deps.store.record(run_id)
    assert again.gateway_requests == 3
    assert again.gateway_input_tokens == 3 * wire["input_tokens"]


def test_a_spent_token_budget_stops_the_turn_at_the_gateway(world: World) -> None:
    run_id = world.run(max_tokens=150)  # one request's: spent, not exceeded
    script = f"{ASK}\n{ASK}\n@complete never"
    assert world.turn(run_id, script) == "failed:budget"
    events = world.events(run_id)
    kind, terminal = events[-1]
    assert kind == "session-error" and terminal["reason"] == "budget"
    assert "model gateway" in terminal["error"]
    assert len(world.fake.model_requests()) == 1  # the second was refused before it went out
    refused = [d for k, d in events if k == "sandbox-activity" and d["kind"] == "model"]
    assert refused and "budget" in refused[0]["description"]
    assert world.deps.store.record(run_id).budget_exceeded is not None


def test_a_rate_limited_upstream_parks_the_turn_with_its_retry_after(world: World) -> None:
    world.fake.set_scenario("http-429")
    run_id = world.run()
    # The harness itself makes nothing of the 429 (it would wait and finish): the turn stops.
    script = f"{ASK}\n@sleep 30\n@complete too late"
    world.turn(run_id, script)
    events = world.events(run_id)
    kinds = [k for k, _ in events]
    assert "parked" in kinds, events
    parked = next(d for k, d in events if k == "parked")
    assert parked["reason"] == "rate-limited"
    kind, terminal = events[-1]
    assert kind == "session-error" and terminal["reason"] == "rate-limited"
    assert terminal["retry_after_s"] == 7


def test_a_failing_model_falls_back_and_the_stream_says_which_served(world: World) -> None:
    world.fake.failing_models = {"fake-model"}
    run_id = world.run(fallback_models=("fake-model-b",))
    assert world.turn(run_id, f"{ASK}\n@complete done") == "completed"
    said = [d["description"] for k, d in world.events(run_id) if k == "sandbox-activity"]
    assert "model fallback: fake-model answered 529; asking fake-model-b" in said
    assert "model fallback: fake-model-b served the request for fake-model" in said
    assert [r.requested_model for r in world.fake.model_requests()] == [
        "fake-model",
        "fake-model-b",
    ]


def test_a_model_key_with_no_upstream_is_refused_never_handed_over(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", REAL)
    with turn_deps(tmp_path, redis_url, "gw", grants={"stdio-json": ("OPENAI_API_KEY",)}) as (
        deps,
        _client,
        executable,
    ):
        run_id = new_run_id()
        options = RunOptions(
            harness="stdio-json", executable=executable, grants=("OPENAI_API_KEY",)
        )
        deps.store.create(run_id, options, queue="q", sandbox="local")
        outcome = execute_turn(
            deps, TurnPayload(run_id=run_id, turn=1, input="@env OPENAI_API_KEY\n@complete x")
        )
        assert outcome == "failed:invalid-input"
        stream = json.dumps(deps.redis.xrange(deps.keys.events(run_id)))
        assert "HARNESS_MODEL_UPSTREAMS" in stream and REAL not in stream


def test_with_the_gateway_off_the_key_is_handed_over_and_the_run_warned(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", REAL)
    with turn_deps(
        tmp_path,
        redis_url,
        "gw",
        grants={"stdio-json": ("OPENAI_API_KEY",)},
        model_gateway="off",
    ) as (deps, client, executable):
        script = f"{HELD}\n@complete x"
        run_id = client.start_run(
            "stdio-json", script, executable=executable, grants=["OPENAI_API_KEY"], sandbox="local"
        )
        warnings = deps.store.record(run_id).warnings or []
        assert any("HARNESS_MODEL_GATEWAY=off" in w for w in warnings)
        assert execute_turn(deps, TurnPayload(run_id=run_id, turn=1, input=script)) == "completed"
        (held,) = tmp_path.glob("**/held-env")
        assert held_key(held) == REAL


def test_a_harness_that_calls_its_turn_complete_after_a_budget_refusal_ends_budget(
    world: World,
) -> None:
    run_id = world.run(max_tokens=150)
    # The second request is refused (400); the harness answers on its own and says complete.
    script = f"{ASK}\n@try-model OPENAI_API_KEY fake-model again\n@complete done anyway"
    assert world.turn(run_id, script) == "failed:budget"
    events = world.events(run_id)
    texts = [d["text"] for k, d in events if k == "assistant-text"]
    assert any(t.startswith("model API 400") for t in texts), texts
    kind, terminal = events[-1]
    assert kind == "session-error" and terminal["reason"] == "budget", terminal
    assert world.deps.store.record(run_id).session_id  # the next turn resumes it
