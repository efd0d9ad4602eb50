"""The five real CLIs end to end: ``harness run|turn --follow`` → Celery → worker → Docker → Redis.

Every turn is checked the same way (:func:`check_turn`): only contract event types, ids
``{turn}-{seq}`` without gaps, ``turn-started`` first and exactly one terminal, last; what
``--follow`` printed is exactly what the stream holds. Usage is compared with what the fake
server reported (:data:`USAGE` per model call), the session and model with what the CLI said,
and the fake server's log shows what reached the model.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import pytest

import tests.fakemodel.server as fake_server
from tests.e2e.conftest import (
    CONTRACT_TYPES,
    HARNESSES,
    Deployment,
    Followed,
    Harness,
    Lines,
    nonce,
    parse_follow,
)
from tests.fakemodel import TEXT_ANSWER, USAGE, RecordedRequest
from tests.fakemodel.clis import STALE_SESSION
from tests.helpers import assert_one_terminal

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.docker,
    pytest.mark.redis,
    pytest.mark.celery,
]

ALL = pytest.mark.parametrize("harness", list(HARNESSES.values()), ids=list(HARNESSES))
REPLAY_HEADER = "[The previous session could not be resumed. The conversation so far:]"
#: The shell command of the tool scenario in this suite: it leaves a file in the run's
#: workspace and prints the user id it ran as (1000 in the container; the tests run as root).
TOOL_COMMAND = "touch e2e-tool-ran && id -u"
#: A container at rest: docker's init and the container's command.
AT_REST = ("/sbin/docker-init", "sleep infinity")
HOME = "/workspace/.home"
"""A run's HOME in its container, where each CLI keeps its sessions."""


# --------------------------------------------------------------------------- checks
def check_turn(e2e: Deployment, followed: Followed, turn: int) -> list[dict[str, Any]]:
    """The stream rules for one turn; returns its events."""
    events = followed.events
    assert followed.turn == turn, followed.describe()
    types = [e["type"] for e in events]
    assert set(types) <= CONTRACT_TYPES, followed.describe()
    assert_one_terminal(events, turn)
    stream = [e.as_dict() for e in e2e.client.events(followed.run_id) if e.turn == turn]
    assert stream == events  # --follow printed the stream, all of it, in order
    expected_exit = 0 if types[-1] == "turn-complete" else 1
    assert followed.returncode == expected_exit, followed.describe()
    return events


def accepted(run: Lines) -> str:
    """The run id ``harness run --json`` prints first."""
    return str(json.loads(run.wait_for(lambda line: '"run_id"' in line, 60))["run_id"])


def agent_calls(requests: list[RecordedRequest]) -> list[RecordedRequest]:
    """Model calls of the agent loop: without opencode's side call that titles a session."""
    return [
        r for r in requests if not any(t.startswith("Generate a title") for t in r.user_texts())
    ]


def check_usage(followed: Followed, calls: int) -> None:
    """The harness's usage events add up to what the fake server reported for ``calls``."""
    usage = [u for u in followed.of_type("usage") if u["source"] == "harness"]
    totals = tuple(
        sum(u[k] for u in usage) for k in ("input_tokens", "cached_input_tokens", "output_tokens")
    )
    expected = (USAGE.input_tokens, USAGE.cached_input_tokens, USAGE.output_tokens)
    assert totals == tuple(calls * n for n in expected), followed.describe()
    done = followed.terminal["data"]
    assert (done["input_tokens"], done["output_tokens"]) == (
        calls * USAGE.input_tokens,
        calls * USAGE.output_tokens,
    )


def check_session(
    followed: Followed, harness: Harness, *, resumed: bool, session_id: str | None = None
) -> str:
    """One session event (the vendor id, the reported model) agreeing with the terminal."""
    (session,) = followed.of_type("session")
    done = followed.terminal["data"]
    assert session["session_id"] and session["resumed"] is resumed, followed.describe()
    if session_id is not None:
        assert session["session_id"] == session_id
    assert done["session_id"] == session["session_id"]
    assert session["model"] == done["model"] == harness.reported_model
    return str(session["session_id"])


def check_system_prompt(calls: list[RecordedRequest], system: str) -> None:
    """The system prompt reached the model's system slot, not the user's messages."""
    assert calls
    for call in calls:
        assert system in call.system_text(), call.system_text()[:2000]
        assert all(system not in text for text in call.user_texts())


def processes(container: Any) -> list[tuple[str, str]]:
    """(uid, command line) of every process in the container but its init and command."""
    top = container.top(ps_args="-eo pid,uid,args")  # docker needs the pid column
    found = [(p[1], p[-1]) for p in top["Processes"] or []]
    return [(uid, args) for uid, args in found if not args.startswith(AT_REST)]


# --------------------------------------------------------------------------- scenarios
@ALL
def test_model_error_ends_the_turn_with_one_classified_session_error(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    followed = e2e.run(harness, f"[scenario:http-500] {word}", error=True)
    check_turn(e2e, followed, 1)
    error = followed.terminal
    assert error["type"] == "session-error", followed.describe()
    # Every adapter classifies a 5xx the CLI gave up on as a retryable harness error.
    assert (error["data"]["reason"], error["data"]["retryable"]) == ("harness-error", True)
    calls = e2e.requests(word)
    assert calls and {r.status for r in calls} == {500}
    record = e2e.client.status(followed.run_id)
    # A retryable failure leaves the run idle: the producer may submit the input again.
    assert record["status"] == "idle" and record["last_error"].startswith("harness-error")


@ALL
def test_turn_then_resumed_turn_in_the_same_container(e2e: Deployment, harness: Harness) -> None:
    word = nonce()
    system = f"SYSTEM-MARKER-{word}: answer briefly."
    # Slow streaming (2 s between chunks) leaves a follower in another process time to see
    # the turn while it runs.
    run = e2e.popen(
        "run",
        harness.id,
        f"remember the word {word} [scenario:slow] [delay:2]",
        *harness.args(e2e.base_url()),
        "--system-prompt",
        system,
        "--follow",
        "--json",
    )
    run_id = accepted(run)
    e2e.made.append(run_id)
    watcher = e2e.popen("events", run_id, "--follow", "--json")
    try:
        code = run.finish()
        first = parse_follow([line for _, line in run.timed()], code, run.stderr())
        watcher.wait_for(lambda line: '"turn-complete"' in line or '"session-error"' in line, 60)
    finally:
        watcher.stop()
    events = check_turn(e2e, first, 1)
    assert first.terminal["type"] == "turn-complete", first.describe()
    assert first.terminal["data"]["text"] == TEXT_ANSWER
    session_id = check_session(first, harness, resumed=False)
    calls = agent_calls(e2e.requests(word))
    check_usage(first, len(calls))

    # The other terminal saw the same events, and saw them while the turn ran.
    seen = watcher.timed()
    assert [json.loads(line) for _, line in seen] == events
    assert seen[0][0] < events[-1]["ts"], "the follower saw nothing before the turn ended"

    check_system_prompt(calls, system)

    record = e2e.client.status(first.run_id)
    assert record["status"] == "idle" and record["turns"] == 1
    assert (record["session_id"], record["resumed"]) == (session_id, False)
    assert record["model_reported"] == harness.reported_model
    assert (record["input_tokens"], record["output_tokens"]) == (
        len(calls) * USAGE.input_tokens,
        len(calls) * USAGE.output_tokens,
    )
    assert record["sandbox"] == "docker"
    container = e2e.container(first.run_id)

    second = e2e.turn(first.run_id, "what was the word?")
    check_turn(e2e, second, 2)
    assert second.terminal["type"] == "turn-complete", second.describe()
    check_session(second, harness, resumed=True, session_id=session_id)
    later = agent_calls(e2e.requests(word))[len(calls) :]
    assert later, "turn 2 made no model call"
    check_usage(second, len(later))
    # The model saw turn 1 again: the resumed vendor session carried the conversation (and
    # the run's system prompt, still in its place).
    assert any(word in t for t in later[-1].user_texts())
    assert TEXT_ANSWER in later[-1].assistant_texts()
    check_system_prompt(later, system)
    assert e2e.client.status(first.run_id)["container_id"] == container.id
    container.reload()
    assert container.status == "running"
    # The session id is the CLI's own: its session store in the run's HOME names it.
    code, found = container.exec_run(["grep", "-rlF", "--", session_id, HOME])
    assert code == 0 and found.strip(), f"{session_id} is in no file under {HOME}"
    # Nothing was installed at run time: the only node_modules is the image's (a symlink).
    code, installed = container.exec_run(["find", HOME, "-name", "node_modules", "!", "-type", "l"])
    assert (code, installed) == (0, b"")


@ALL
def test_tool_call_runs_the_command_inside_the_container(
    e2e: Deployment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_server, "TOOL_COMMAND", TOOL_COMMAND)
    word = nonce()
    followed = e2e.run(harness, f"[scenario:tool] run it {word}", "--posture", "dangerous")
    check_turn(e2e, followed, 1)
    assert followed.terminal["type"] == "turn-complete", followed.describe()
    # (Network egress: a CLI's own side calls, telemetry and update checks, are refused and
    # reported as ``network`` activities; tests/e2e/test_egress.py looks at those.)
    (activity,) = [a for a in followed.of_type("sandbox-activity") if a["kind"] != "network"]
    assert activity["kind"] == "command" and TOOL_COMMAND in activity["description"]
    calls = agent_calls(e2e.requests(word))
    assert len(calls) == 2, [r.user_texts() for r in calls]  # the call, then the answer
    results = calls[-1].conversation.tool_results()  # type: ignore[union-attr]
    # It ran as the container's user (1000; these tests run as root).
    assert results and re.search(r"(?<![\w.])1000(?![\w.])", results[-1]), results
    check_usage(followed, 2)
    check_session(followed, harness, resumed=False)
    # The command's file is in the container's workspace, made by the container's user.
    code, out = e2e.container(followed.run_id).exec_run(
        ["stat", "-c", "%u", "/workspace/e2e-tool-ran"]
    )
    assert (code, out.decode().strip()) == (0, "1000")


@ALL
def test_stale_resume_session_on_a_first_turn_starts_fresh(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    stale = STALE_SESSION[harness.id]
    followed = e2e.run(harness, f"hello {word}", "--resume-session", stale)
    events = check_turn(e2e, followed, 1)
    assert followed.terminal["type"] == "turn-complete", followed.describe()
    assert events[0]["data"]["attempt"] == 1
    session_id = check_session(followed, harness, resumed=False)
    assert session_id != stale
    # Nothing to replay on a first turn: no replay usage, and the model saw only the input.
    assert [u for u in followed.of_type("usage") if u["source"] == "replay"] == []
    calls = agent_calls(e2e.requests(word))
    assert calls and all(REPLAY_HEADER not in r.body_text() for r in calls)
    check_usage(followed, len(calls))
    record = e2e.client.status(followed.run_id)
    assert (record["session_id"], record["resumed"]) == (session_id, False)


@ALL
def test_stale_session_on_a_later_turn_replays_the_conversation_into_a_fresh_one(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    first = e2e.run(harness, f"remember the word {word}")
    check_turn(e2e, first, 1)
    assert first.terminal["type"] == "turn-complete", first.describe()
    turn1_calls = len(agent_calls(e2e.requests(word)))
    # The vendor lost the session: turn 2 offers an id the CLI does not know.
    stale = STALE_SESSION[harness.id]
    e2e.env.redis().hset(e2e.env.keys.run(first.run_id), "session_id", stale)

    question = "what was the word?"
    second = e2e.turn(first.run_id, question)
    events = check_turn(e2e, second, 2)
    assert second.terminal["type"] == "turn-complete", second.describe()
    assert events[0]["data"]["attempt"] == 1
    session_id = check_session(second, harness, resumed=False)
    assert session_id not in (stale, first.terminal["data"]["session_id"])

    # The fresh session got turn 1 replayed in front of the new input ...
    later = agent_calls(e2e.requests(word))[turn1_calls:]
    assert later, "turn 2 made no model call"
    prompt = next(t for t in later[0].user_texts() if REPLAY_HEADER in t)
    assert word in prompt and TEXT_ANSWER in prompt
    replayed = prompt[prompt.index(REPLAY_HEADER) : prompt.rindex(question)]
    # ... and those tokens are accounted as replay, apart from what the harness reported.
    (replay,) = [u for u in second.of_type("usage") if u["source"] == "replay"]
    assert replay["input_tokens"] == math.ceil(len(replayed) / 4)
    assert replay["output_tokens"] == 0
    check_usage(second, len(later))
    record = e2e.client.status(first.run_id)
    assert (record["session_id"], record["resumed"]) == (session_id, False)
    assert (
        record["input_tokens"]
        == (turn1_calls + len(later)) * USAGE.input_tokens + (replay["input_tokens"])
    )


@ALL
def test_cancel_mid_turn_stops_the_harness_inside_the_container(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    run = e2e.popen(
        "run",
        harness.id,
        f"[scenario:slow] [delay:30] {word}",
        *harness.args(e2e.base_url()),
        "--follow",
        "--json",
    )
    try:
        run_id = accepted(run)
        e2e.made.append(run_id)
        deadline = time.monotonic() + 90
        while not e2e.requests(word):  # the CLI is waiting on the model's slow stream
            assert time.monotonic() < deadline, e2e.worker_log()
            time.sleep(0.2)
        container = e2e.container(run_id)
        running = processes(container)
        # The CLI (and whatever it started) runs in the container, as the non-root user.
        assert any(harness.binary in args for _, args in running), running
        assert {uid for uid, _ in running} == {"1000"}, running
        cancelled = e2e.cli("cancel", run_id, "--json")
        asked = time.monotonic()
        assert cancelled.returncode == 0 and '"cancelled": true' in cancelled.stdout
        code = run.finish(60)
    finally:
        run.stop()
    took = time.monotonic() - asked
    followed = parse_follow([line for _, line in run.timed()], code, run.stderr())
    check_turn(e2e, followed, 1)
    terminal = followed.terminal
    assert terminal["type"] == "session-error", followed.describe()
    assert (terminal["data"]["reason"], terminal["data"]["retryable"]) == ("cancelled", False)
    assert took < 15, f"cancel took {took:.1f}s"
    assert processes(container) == [], "harness processes left in the container"
    assert e2e.client.status(run_id)["status"] == "idle"
