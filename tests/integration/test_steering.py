"""Messages to a run (``harness steer``) through a real worker, the demo harness over
stdio-json in the local sandbox: a steer taken mid-turn on the harness's own channel (``--posture
ask``), an emulated steer and an interrupt (the turn stopped, the message the next turn in the
same session), a queued message, a message to an idle run, the refusals, and the reaper's
backstop for a message whose delivery died with its process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers import assert_one_terminal
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient, StreamEvent
from worker.control import messages
from worker.control.messages import Message
from worker.errors import InvalidInput, RunEnded, RunNotFound

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def steer_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("steer"), redis_url, HARNESS_REAP_INTERVAL_S="2")
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def steer_worker(steer_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(steer_env)
    yield worker
    worker.stop()


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def wait_for(client: HarnessClient, run_id: str, kind: str, turn: int = 1) -> StreamEvent:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for event in turn_events(client, run_id, turn):
            if event.type == kind:
                return event
        time.sleep(0.05)
    raise AssertionError(f"no {kind} in turn {turn} of {run_id}")


def test_a_steer_reaches_the_running_turn_on_its_own_channel(
    steer_env: Env, steer_worker: WorkerProcess
) -> None:
    client = steer_env.client()
    run_id = client.start_run(
        "stdio-json", "@text waiting\n@wait-message 30", executable=DEMO, posture="ask"
    )
    wait_for(client, run_id, "assistant-text")
    sent = client.steer(run_id, "look at the tests first", mode="steer", by="tester")
    assert sent["state"] == "sent-to-turn" and sent["turn"] == 1
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    events = turn_events(client, run_id, 1)
    assert_one_terminal(events)
    kinds = [e.type for e in events]
    said = events[kinds.index("user-message")]
    assert said.data == {
        "text": "look at the tests first",
        "mode": "steer",
        "by": "tester",
        "delivery": "native",
        "message_id": sent["message_id"],
    }
    heard = [e.data["text"] for e in events if e.type == "assistant-text"]
    assert "message: look at the tests first" in heard
    assert kinds.index("user-message") < kinds.index("turn-complete")
    assert client.status(run_id)["turns"] == 1  # no turn more: the harness took it


@pytest.mark.parametrize("mode", ["steer", "interrupt"])
def test_a_message_the_turn_cannot_take_stops_it_and_starts_the_next(
    steer_env: Env, steer_worker: WorkerProcess, mode: str
) -> None:
    client = steer_env.client()
    run_id = client.start_run("stdio-json", "@text working\n@wait-message 60", executable=DEMO)
    wait_for(client, run_id, "assistant-text")
    first_session = wait_for(client, run_id, "session").data["session_id"]
    began = time.monotonic()
    sent = client.steer(run_id, "stop and summarise", mode=mode)
    stopped = client.wait(run_id, 1, timeout=30)
    assert time.monotonic() - began < 20  # not the 60 s the harness would have waited
    assert stopped.type == "session-error" and stopped.data["reason"] == "cancelled"
    assert "message" in stopped.data["error"]
    answer = client.wait(run_id, 2, timeout=30)
    assert answer.type == "turn-complete"
    events = turn_events(client, run_id, 2)
    assert_one_terminal(events)
    assert [e.type for e in events][:2] == ["turn-started", "user-message"]
    assert events[1].data["delivery"] == ("emulated" if mode == "steer" else "next-turn")
    assert events[1].data["message_id"] == sent["message_id"]
    session = next(e for e in events if e.type == "session")
    assert session.data["session_id"] == first_session and session.data["resumed"] is True
    assert events[0].data["input_chars"] == len("stop and summarise")
    # The stopped turn's input stays in the transcript: a turn that cannot resume the session
    # replays it (with no answer), so the conversation keeps what the model saw.
    said = [(e["turn"], e["input"], e["output"]) for e in client.store.transcript(run_id)]
    assert said[0] == (1, "@text working\n@wait-message 60", "")


def test_a_queued_message_waits_for_the_turn_and_becomes_the_next(
    steer_env: Env, steer_worker: WorkerProcess
) -> None:
    client = steer_env.client()
    run_id = client.start_run("stdio-json", "@text busy\n@sleep 2", executable=DEMO)
    wait_for(client, run_id, "assistant-text")
    first = client.steer(run_id, "then write the docs", mode="queue")
    second = client.steer(run_id, "and the changelog", mode="queue")
    assert first["state"] == second["state"] == "queued"
    assert client.wait(run_id, 1, timeout=30).type == "turn-complete"  # not stopped
    assert client.wait(run_id, 2, timeout=30).type == "turn-complete"
    events = turn_events(client, run_id, 2)
    said = [e.data for e in events if e.type == "user-message"]
    assert [m["text"] for m in said] == ["then write the docs", "and the changelog"]
    assert {m["delivery"] for m in said} == {"next-turn"}
    assert events[0].data["input_chars"] == len("then write the docs\n\nand the changelog")
    assert client.status(run_id)["turns"] == 2


def test_a_message_to_an_idle_run_starts_its_next_turn(
    steer_env: Env, steer_worker: WorkerProcess
) -> None:
    client = steer_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    for mode in ("steer", "interrupt", "queue"):
        sent = client.steer(run_id, f"again, by {mode}", mode=mode)
        assert sent["state"] == "started"
        assert client.wait(run_id, sent["turn"], timeout=30).type == "turn-complete"
    assert client.status(run_id)["turns"] == 4


def test_refusals(steer_env: Env, steer_worker: WorkerProcess) -> None:
    client = steer_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    with pytest.raises(InvalidInput, match="mode"):
        client.steer(run_id, "x", mode="shout")
    with pytest.raises(InvalidInput, match="text"):
        client.steer(run_id, "   ")
    with pytest.raises(InvalidInput, match="control characters"):
        client.steer(run_id, "x", by="ana\x1b[2J")  # a terminal escape in who said it
    with pytest.raises(InvalidInput, match="NUL"):
        client.steer(run_id, "x\x00y")
    with pytest.raises(RunNotFound):
        client.steer("r" + "0" * 24, "x")
    client.end(run_id)
    with pytest.raises(RunEnded):
        client.steer(run_id, "too late")
    assert client.status(run_id)["turns"] == 1


def test_the_reaper_delivers_what_a_dead_process_left_in_the_inbox(
    steer_env: Env, steer_worker: WorkerProcess
) -> None:
    """The process that ended the turn died before it delivered: the message is in the
    inbox of an idle run (put there as that process would have), and the reaper starts it."""
    client = steer_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    client.wait(run_id, 1, timeout=30)
    left = Message.new("picked up by the reaper", "queue", "tester")
    messages.to_inbox(client.redis, client.keys, run_id, [left], 600)
    assert client.wait(run_id, 2, timeout=30).type == "turn-complete"
    said = [e for e in turn_events(client, run_id, 2) if e.type == "user-message"]
    assert [e.data["message_id"] for e in said] == [left.message_id]
    assert not client.redis.sismember(client.keys.inboxes(), run_id)
