"""Permission requests answered live (``--posture ask``) through a real worker: the demo
harness over stdio-json, local sandbox. Approve, deny, deadline, cancel, always, a second
answer and an unknown one."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import adapters
from tests.helpers import assert_one_terminal
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient, StreamEvent
from worker.errors import AnswerRefused, InvalidInput, RequestNotFound

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def ask_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("ask"), redis_url, HARNESS_PERMISSION_TIMEOUT_S="3")
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def ask_worker(ask_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(ask_env)
    yield worker
    worker.stop()


def start(client: HarnessClient, script: str) -> str:
    return client.start_run("stdio-json", script, executable=DEMO, posture="ask")


def wait_pending(client: HarnessClient, run_id: str, count: int = 1) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = client.pending(run_id)
        if len(pending) >= count:
            return pending
        time.sleep(0.05)
    raise AssertionError(f"no pending request in {run_id}")


def turn_events(client: HarnessClient, run_id: str, turn: int = 1) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def workspace(env: Env, run_id: str) -> Path:
    return env.tmp / "workspaces" / "local" / "run" / run_id


def test_approved_request_runs_the_command(ask_env: Env, ask_worker: WorkerProcess) -> None:
    client = ask_env.client()
    run_id = start(client, "@ask touch approved.txt")
    [request] = wait_pending(client, run_id)
    assert request["request_id"] == "p1-1" and request["command"] == "touch approved.txt"
    answer = client.approve(run_id, "p1-1", by="tester")
    assert answer["decision"] == "allow"
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    events = turn_events(client, run_id)
    assert_one_terminal(events)
    kinds = [e.type for e in events]
    asked, decided = kinds.index("permission-request"), kinds.index("permission-decision")
    assert asked < decided < kinds.index("sandbox-activity")
    assert events[asked].data["deadline"] > time.time() - 60
    assert events[decided].data == {
        "request_id": "p1-1",
        "decision": "allow",
        "scope": "once",
        "by": "tester",
        "message": None,
    }
    assert (workspace(ask_env, run_id) / "approved.txt").exists()
    assert client.pending(run_id) == []


def test_denied_request_does_not_run_and_the_harness_is_told(
    ask_env: Env, ask_worker: WorkerProcess
) -> None:
    client = ask_env.client()
    run_id = start(client, "@ask touch denied.txt")
    wait_pending(client, run_id)
    client.deny(run_id, "p1-1", message="not today")
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    events = turn_events(client, run_id)
    decision = next(e for e in events if e.type == "permission-decision")
    assert decision.data["decision"] == "deny" and decision.data["message"] == "not today"
    assert any("not running touch denied.txt: not today" in e.data.get("text", "") for e in events)
    assert not (workspace(ask_env, run_id) / "denied.txt").exists()


def test_second_late_and_unknown_answers_are_refused(
    ask_env: Env, ask_worker: WorkerProcess
) -> None:
    client = ask_env.client()
    run_id = start(client, "@permission deploy")
    wait_pending(client, run_id)
    with pytest.raises(RequestNotFound):
        client.approve(run_id, "p1-9")
    client.deny(run_id, "p1-1", by="first")
    with pytest.raises(AnswerRefused, match=r"already answered \(deny by first\)"):
        client.approve(run_id, "p1-1", by="second")
    client.wait(run_id, 1, timeout=30)
    with pytest.raises(AnswerRefused):
        client.approve(run_id, "p1-1")


def test_no_answer_by_the_deadline_is_a_deny_and_the_turn_clock_stands_still(
    ask_env: Env, ask_worker: WorkerProcess
) -> None:
    client = ask_env.client()
    # The turn's own timeout (2 s) is shorter than the request's deadline (3 s): it must not
    # run while the request waits.
    run_id = client.start_run(
        "stdio-json", "@ask touch late.txt", executable=DEMO, posture="ask", timeout_s=2
    )
    wait_pending(client, run_id)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete", terminal.data
    decision = next(e for e in turn_events(client, run_id) if e.type == "permission-decision")
    assert decision.data["decision"] == "deny" and decision.data["by"] == "worker:deadline"
    assert not (workspace(ask_env, run_id) / "late.txt").exists()
    with pytest.raises(AnswerRefused):
        client.approve(run_id, "p1-1")


def test_cancel_while_a_request_waits_denies_it(ask_env: Env, ask_worker: WorkerProcess) -> None:
    client = ask_env.client()
    run_id = start(client, "@ask touch cancelled.txt")
    wait_pending(client, run_id)
    assert client.cancel(run_id)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "session-error" and terminal.data["reason"] == "cancelled"
    events = turn_events(client, run_id)
    assert_one_terminal(events)
    decision = next(e for e in events if e.type == "permission-decision")
    assert decision.data["decision"] == "deny" and decision.data["by"] == "worker:cancelled"
    assert client.pending(run_id) == []
    with pytest.raises(AnswerRefused, match="worker:cancelled"):
        client.approve(run_id, "p1-1")
    assert not (workspace(ask_env, run_id) / "cancelled.txt").exists()


def test_always_allows_the_same_call_again_without_asking(
    ask_env: Env, ask_worker: WorkerProcess
) -> None:
    client = ask_env.client()
    run_id = start(client, "@ask touch again.txt\n@ask touch again.txt")
    wait_pending(client, run_id)
    client.approve(run_id, "p1-1", always=True)
    assert client.wait(run_id, 1, timeout=30).type == "turn-complete"
    decisions = [e.data for e in turn_events(client, run_id) if e.type == "permission-decision"]
    assert [(d["request_id"], d["scope"], d["by"]) for d in decisions][1] == (
        "p1-2",
        "always",
        "rule:always",
    )
    # And in the next turn of the run too.
    client.submit_turn(run_id, "@ask touch again.txt")
    assert client.wait(run_id, 2, timeout=30).type == "turn-complete"
    [decision] = [e for e in turn_events(client, run_id, 2) if e.type == "permission-decision"]
    assert decision.data["by"] == "rule:always"


def test_ask_is_refused_for_a_harness_without_a_live_channel(
    ask_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every adapter asks live now: take the channel away from one.
    codex = adapters.get("codex")
    caps = dataclasses.replace(codex.CAPABILITIES, permission_ask=False)
    monkeypatch.setattr(codex, "CAPABILITIES", caps)
    with pytest.raises(InvalidInput, match="permission_ask"):
        ask_env.client().start_run("codex", "hello", posture="ask")


def test_allow_and_deny_patterns_answer_before_anyone_is_asked(
    ask_env: Env, ask_worker: WorkerProcess
) -> None:
    """--deny first, then --allow, for a harness that applies no pattern itself: the worker
    answers the request at once, and says which rule did."""
    client = ask_env.client()
    run_id = client.start_run(
        "stdio-json",
        "@ask touch allowed.txt\n@ask touch blocked.txt\n@ask touch asked.txt",
        executable=DEMO,
        posture="ask",
        allow=("Bash(touch allowed*)",),
        deny=("bash(touch blocked:*)",),
    )
    [request] = wait_pending(client, run_id)  # only the third one waits for a person
    assert request["command"] == "touch asked.txt"
    client.deny(run_id, request["request_id"])
    assert client.wait(run_id, 1, timeout=30).type == "turn-complete"
    decisions = [e.data for e in turn_events(client, run_id) if e.type == "permission-decision"]
    assert [(d["decision"], d["by"]) for d in decisions] == [
        ("allow", "rule:allow:Bash(touch allowed*)"),
        ("deny", "rule:deny:bash(touch blocked:*)"),
        ("deny", decisions[2]["by"]),
    ]
    ws = workspace(ask_env, run_id)
    assert (ws / "allowed.txt").exists()
    assert not (ws / "blocked.txt").exists() and not (ws / "asked.txt").exists()
