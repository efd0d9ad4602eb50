"""Tool sets from plain functions, and their calls as durable requests in a real Redis."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Literal, cast

import pytest
import redis

from worker.store.keys import Keys, SyncRedis
from worker.tools import calls
from worker.tools.schema import ToolError, tool, tool_set


def lookup_order(order_id: int, verbose: bool = False) -> dict[str, object]:
    """Look up an order by its id."""
    return {"id": order_id, "status": "shipped", "verbose": verbose}


def shout(text: str, mode: Literal["upper", "lower"] = "upper") -> str:
    return text.upper() if mode == "upper" else text.lower()


def test_schema_and_description_come_from_the_signature_and_docstring() -> None:
    made = tool(lookup_order)
    assert made.description == "Look up an order by its id."
    schema = made.input_schema
    assert schema["type"] == "object" and schema["required"] == ["order_id"]
    assert schema["properties"]["order_id"]["type"] == "integer"
    assert schema["properties"]["verbose"]["default"] is False
    assert schema["additionalProperties"] is False
    assert tool(shout).input_schema["properties"]["mode"]["enum"] == ["upper", "lower"]


def test_arguments_are_validated_and_results_become_text() -> None:
    made = tool(lookup_order)
    assert json.loads(made.call({"order_id": "7"})) == {
        "id": 7,
        "status": "shipped",
        "verbose": False,
    }
    with pytest.raises(ToolError, match="invalid arguments"):
        made.call({"order_id": "seven"})
    with pytest.raises(ToolError):
        made.call({"order_id": 1, "extra": True})


def test_an_explicit_schema_passes_the_arguments_as_they_came() -> None:
    made = tool(lambda **kw: sorted(kw), name="keys", input_schema={"type": "object"})
    assert made.call({"b": 1, "a": 2}) == '["a","b"]'


def test_untyped_or_variadic_handlers_and_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="has no type"):
        tool(lambda x: x, name="untyped")
    with pytest.raises(ValueError, match=r"\*args"):
        tool(lambda *a: a, name="variadic")
    with pytest.raises(ValueError, match="tool name"):
        tool(shout, name="has space")


def test_a_set_is_a_function_a_list_or_a_mapping_with_unique_names() -> None:
    assert list(tool_set(shout)) == ["shout"]
    assert list(tool_set([shout, lookup_order])) == ["shout", "lookup_order"]
    assert list(tool_set({"loud": shout})) == ["loud"]
    with pytest.raises(ValueError, match="two tools"):
        tool_set([shout, shout])
    with pytest.raises(ValueError, match="at least one"):
        tool_set([])


@pytest.fixture
def store(redis_url: str) -> Iterator[tuple[SyncRedis, Keys]]:
    client = cast(SyncRedis, redis.Redis.from_url(redis_url, decode_responses=True))
    keys = Keys(f"test-tools-{uuid.uuid4().hex[:8]}")
    yield client, keys
    for key in cast(redis.Redis, client).scan_iter(f"{keys.prefix}:*"):
        client.delete(key)
    client.close()


def boom(reason: str) -> str:
    raise RuntimeError(f"cannot: {reason}")


def _call(
    client: SyncRedis, keys: Keys, tool_name: str, arguments: object, *, deadline_s: float = 5.0
) -> tuple[str, str]:
    call_id = f"t1-{uuid.uuid4().hex[:6]}"
    entry = calls.submit(
        client, keys, "demo", run_id="r1", call_id=call_id, tool=tool_name,
        arguments=json.dumps(arguments), deadline=time.time() + deadline_s,
    )  # fmt: skip
    return call_id, entry


@pytest.mark.redis
def test_a_server_answers_and_a_raising_handler_returns_its_text(
    store: tuple[SyncRedis, Keys],
) -> None:
    client, keys = store
    server = calls.ToolServer(client, keys, "demo", tool_set([shout, boom]))
    calls.ensure_group(client, keys, "demo")
    first, _ = _call(client, keys, "shout", {"text": "hi"})
    second, _ = _call(client, keys, "boom", {"reason": "no"})
    third, _ = _call(client, keys, "missing", {})
    for _ in range(3):
        assert server.serve_one(1.0)
    deadline = time.time() + 2
    assert calls.wait_reply(client, keys, "r1", first, deadline) == calls.Reply(True, "HI")
    raised = calls.wait_reply(client, keys, "r1", second, deadline)
    assert raised == calls.Reply(False, "RuntimeError: cannot: no")
    unknown = calls.wait_reply(client, keys, "r1", third, deadline)
    assert unknown is not None and not unknown.ok and "unknown tool" in unknown.output
    assert client.xrange(keys.tool_calls("demo")) == []  # answered calls are gone


@pytest.mark.redis
def test_a_call_past_its_deadline_is_dropped_unanswered(store: tuple[SyncRedis, Keys]) -> None:
    client, keys = store
    calls.ensure_group(client, keys, "demo")
    call_id, _ = _call(client, keys, "shout", {"text": "late"}, deadline_s=-1)
    server = calls.ToolServer(client, keys, "demo", tool_set(shout))
    assert server.serve_one(0.5)
    assert calls.wait_reply(client, keys, "r1", call_id, time.time() + 0.3) is None
    assert server.answered == 0


@pytest.mark.redis
def test_a_claim_that_lapses_is_taken_by_another_server(store: tuple[SyncRedis, Keys]) -> None:
    client, keys = store
    calls.ensure_group(client, keys, "demo")
    call_id, _ = _call(client, keys, "shout", {"text": "again"})
    # A server that took the call and died: it read the entry and never answered.
    got = client.xreadgroup(calls.GROUP, "dead", {keys.tool_calls("demo"): ">"}, count=1)
    assert got
    other = calls.ToolServer(client, keys, "demo", tool_set(shout), lease_s=0.3)
    assert not other.serve_one(0.1)  # the claim still holds
    time.sleep(0.35)
    assert other.serve_one(0.1)
    assert calls.wait_reply(client, keys, "r1", call_id, time.time() + 1) == calls.Reply(
        True, "AGAIN"
    )


@pytest.mark.redis
def test_a_slow_handler_keeps_its_claim_past_the_lease(store: tuple[SyncRedis, Keys]) -> None:
    client, keys = store
    calls.ensure_group(client, keys, "demo")

    def slow(text: str) -> str:
        time.sleep(0.8)
        return text

    call_id, _ = _call(client, keys, "slow", {"text": "mine"})
    busy = calls.ToolServer(client, keys, "demo", tool_set(slow), lease_s=0.3, consumer="busy")
    other = calls.ToolServer(client, keys, "demo", tool_set(slow), lease_s=0.3, consumer="other")
    worker = threading.Thread(target=busy.serve_one, args=(1.0,))
    worker.start()
    time.sleep(0.5)
    assert not other.serve_one(0.1)  # renewed: not lapsed
    worker.join()
    assert calls.wait_reply(client, keys, "r1", call_id, time.time() + 1) == calls.Reply(
        True, "mine"
    )
    assert other.answered == 0
