"""Messages to a run, on fakeredis: their delivery as the next turn (one owner,
worker/control/delivery.py), the size and count bounds, what a running turn does with them
(worker/turn/steering.py), and the nudge that wakes a turn's read loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import adapters
from adapters.protocol import TurnRequest
from sandbox.base import Chunk
from sandbox.chunks import ChunkQueue
from tests.unit import test_execute_turn
from tests.unit.test_execute_turn import World
from worker.control import delivery, messages
from worker.control.messages import Message
from worker.errors import InvalidInput
from worker.options.spec import TurnPayload
from worker.store.queued import read as read_queued
from worker.turn.attempt import Publishing
from worker.turn.execute import execute_turn
from worker.turn.steering import Steering

make_world = test_execute_turn.make_world

SENT: list[tuple[dict[str, Any], str, float]] = []


@pytest.fixture
def world(make_world: Any) -> World:
    SENT.clear()
    made: World = make_world()
    made.deps.send_turn = lambda payload, queue, countdown: SENT.append((payload, queue, countdown))
    return made


def idle_run(world: World) -> str:
    run_id = world.run()
    assert world.turn(run_id, "hello") == "completed"
    return run_id


def post(world: World) -> delivery.Post:
    return delivery.post_for(world.deps)


def wait(world: World, run_id: str, *texts: str) -> list[Message]:
    sent = [Message.new(text, "queue", "tester") for text in texts]
    messages.to_inbox(world.client, world.keys, run_id, sent, 600)
    return sent


def test_waiting_messages_become_the_next_turn(world: World) -> None:
    run_id = idle_run(world)
    sent = wait(world, run_id, "first", "second")
    assert delivery.deliver(post(world), run_id) == 2
    ((payload, queue, countdown),) = SENT
    assert payload["turn"] == 2 and payload["input"] == "first\n\nsecond"
    assert [m["message_id"] for m in payload["messages"]] == [m.message_id for m in sent]
    assert (queue, countdown) == ("q", 0.0)
    assert read_queued(world.client, world.keys, run_id, 2) is not None  # the reaper's copy
    assert messages.waiting(world.client, world.keys, run_id) == 0
    assert not world.client.sismember(world.keys.inboxes(), run_id)
    assert execute_turn(world.deps, TurnPayload.model_validate(payload)) == "completed"
    said = [e for e in world.events(run_id, 2) if e[1] == "user-message"]
    assert [e[2]["text"] for e in said] == ["first", "second"]
    assert [e[0] for e in world.events(run_id, 2)][:3] == ["2-0", "2-1", "2-2"]


def test_nothing_is_delivered_while_a_turn_is_in_flight_or_when_nothing_waits(
    world: World,
) -> None:
    run_id = world.run()  # turn 1 in flight
    wait(world, run_id, "later")
    assert delivery.deliver(post(world), run_id) is None
    assert messages.waiting(world.client, world.keys, run_id) == 1
    idle = idle_run(world)
    world.client.sadd(world.keys.inboxes(), idle)
    assert delivery.deliver(post(world), idle) is None
    assert not world.client.sismember(world.keys.inboxes(), idle)
    assert SENT == []


def test_a_turn_takes_only_what_fits_its_input_and_the_rest_waits(make_world: Any) -> None:
    world: World = make_world(max_input_bytes=10)
    world.deps.send_turn = lambda payload, queue, countdown: SENT.append(
        (payload, queue, countdown)
    )
    SENT.clear()
    run_id = idle_run(world)
    wait(world, run_id, "12345", "678", "abcdefgh")
    assert delivery.deliver(post(world), run_id) == 2
    assert SENT[-1][0]["input"] == "12345\n\n678"
    assert messages.waiting(world.client, world.keys, run_id) == 1
    # The worker that ends turn 2 delivers what still waits (its one owner, called there).
    assert execute_turn(world.deps, TurnPayload.model_validate(SENT[-1][0])) == "completed"
    assert SENT[-1][0]["turn"] == 3 and SENT[-1][0]["input"] == "abcdefgh"


def test_an_ended_run_drops_its_messages_and_a_spent_budget_keeps_them(world: World) -> None:
    run_id = idle_run(world)
    wait(world, run_id, "too late")
    world.store.request_end(run_id)
    assert delivery.deliver(post(world), run_id) is None
    assert messages.waiting(world.client, world.keys, run_id) == 0

    capped = world.run(max_turns=1)
    assert world.turn(capped, "hello") == "completed"
    wait(world, capped, "one more")
    assert delivery.deliver(post(world), capped) is None
    assert messages.waiting(world.client, world.keys, capped) == 1
    assert "max_turns" in (world.store.record(capped).last_error or "")
    assert SENT == []


def test_what_reached_a_turn_too_late_is_carried_to_the_next(world: World) -> None:
    run_id = idle_run(world)
    late = Message.new("missed it", "steer", "tester")
    messages.to_turn(world.client, world.keys, run_id, 1, late, 600)
    assert delivery.deliver(post(world), run_id) == 2
    assert SENT[-1][0]["messages"][0]["message_id"] == late.message_id
    assert not world.client.exists(world.keys.turn_messages(run_id, 1))


def test_the_count_of_waiting_messages_is_bounded(make_world: Any) -> None:
    from worker.client.steering import Steering as ClientSteering

    world: World = make_world(max_waiting_messages=2)
    run_id = world.run()  # in flight: queued messages wait
    steering = ClientSteering(
        world.deps.settings, world.client, world.keys, world.store,
        lambda: (lambda payload, queue, countdown: None), lambda run: False,
    )  # fmt: skip
    steering.steer(run_id, "one")
    steering.steer(run_id, "two", mode="steer")
    with pytest.raises(InvalidInput, match="HARNESS_MAX_WAITING_MESSAGES=2"):
        steering.steer(run_id, "three")


class Recording:
    """What a harness process was sent (the stdin side of a real process, recorded)."""

    def __init__(self, accepts: bool = True) -> None:
        self.lines: list[bytes] = []
        self.accepts = accepts
        self.nudges = 0

    def write(self, data: bytes) -> bool:
        self.lines.append(data)
        return self.accepts

    def nudge(self) -> None:
        self.nudges += 1


def steering_for(world: World, run_id: str, posture: str) -> tuple[Steering, Recording, Publishing]:
    from worker.store.publisher import RedisStreamPublisher

    out = Publishing(RedisStreamPublisher(world.client, world.keys, run_id, 1, maxlen=1000))
    steering = Steering(world.client, world.keys, run_id, 1, out, 600)
    adapter = adapters.get("stdio-json")
    request = TurnRequest(input="x", executable="demo", posture=posture)  # type: ignore[arg-type]
    process = Recording()
    steering.attach(adapter, adapter.new_state(request), process)  # type: ignore[arg-type]
    return steering, process, out


def test_a_steer_on_the_harnesss_channel_is_written_and_published(world: World) -> None:
    run_id = world.run()
    steering, process, out = steering_for(world, run_id, "ask")
    sent = Message.new("use tabs", "steer", "ana")
    messages.to_turn(world.client, world.keys, run_id, 1, sent, 600)
    assert steering.poll() is None
    assert process.lines == [b'{"type": "message", "text": "use tabs", "mode": "steer"}\n']
    out.publisher.drain(5)
    [(_, kind, data)] = world.events(run_id, 1)
    assert kind == "user-message" and data["delivery"] == "native" and data["by"] == "ana"
    steering.close()


def test_a_steer_without_a_channel_or_an_interrupt_stops_the_turn(world: World) -> None:
    run_id = world.run()
    steering, process, _ = steering_for(world, run_id, "auto")
    first = Message.new("go left", "steer", "ana")
    second = Message.new("no, right", "interrupt", "bo")
    messages.to_turn(world.client, world.keys, run_id, 1, first, 600)
    messages.to_turn(world.client, world.keys, run_id, 1, second, 600)
    stop = steering.poll()
    assert stop is not None and stop.reason == "cancelled" and "ana" in stop.error
    assert process.lines == []
    waiting = messages.take_inbox(world.client, world.keys, run_id)
    assert [(m.message_id, m.emulated) for m in waiting] == [
        (first.message_id, True),
        (second.message_id, False),
    ]
    steering.close()


def test_a_sent_message_rings_the_turn_it_went_to(world: World) -> None:
    run_id = world.run()
    steering, process, _ = steering_for(world, run_id, "ask")
    time.sleep(0.2)  # the bell's subscriber is listening
    messages.to_turn(world.client, world.keys, run_id, 1, Message.new("hi", "steer", "a"), 600)
    deadline = time.monotonic() + 5
    while not steering.rung and time.monotonic() < deadline:
        time.sleep(0.01)
    assert steering.rung and process.nudges >= 1
    steering.close()


def woken_by_a_nudge(read: Callable[[float], object], nudge: Callable[[], None]) -> float:
    """Seconds a ``read(10.0)`` waited, in another thread, before a ``nudge`` 0.05 s in made it
    return None (shared with tests/unit/test_local_sandbox.py)."""
    woke: list[float] = []

    def reader() -> None:
        began = time.monotonic()
        assert read(10.0) is None
        woke.append(time.monotonic() - began)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    nudge()
    thread.join(5)
    assert woke, "the read did not return"
    return woke[0]


def test_a_nudge_wakes_a_waiting_read_and_loses_no_chunk() -> None:
    chunks = ChunkQueue(streams=1)
    assert woken_by_a_nudge(chunks.get, chunks.nudge) < 5
    chunks.put(Chunk("stdout", b"data"))
    assert chunks.get(1.0) == Chunk("stdout", b"data")
