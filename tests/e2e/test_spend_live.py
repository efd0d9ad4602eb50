"""Spend under control, live: the five real CLIs in their container, through a real worker.

The fake model server refuses a run's first calls (``[limited:SCENARIO:CALLS:KEY]``,
tests/fakemodel/limits.py), announcing a reset of 1 second or none. Every model call goes
through the model gateway, which reads the limit and its reset off the wire: the first refused
call stops the turn, whatever the CLI would have made of it (several CLIs retried a limit for
minutes before they gave up, and some lost the reset on the way), and the CLI's own retries go
no further than the gateway. A rate limit parks the run (for the reset, or a backoff when the
API announced none); at the reset the worker sends the turn again, the CLI resumes its session
and the run completes (``harness run --follow`` follows it through). A quota with a reset
parks the run too; one without is a spend cap and is not retried. A budget of a few tokens
stops a CLI's turn midway with reason ``budget``; once raised, the next turn resumes the
session.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from tests.e2e.conftest import (
    GRANTS,
    HARNESSES,
    WORKER_SECRETS,
    Deployment,
    Followed,
    Harness,
    nonce,
)
from tests.fakemodel import TEXT_ANSWER, FakeModelServer
from tests.fakemodel.limits import RESET_S
from tests.fakemodel.scenarios import TOOL_FINAL_PREFIX
from tests.helpers import assert_one_terminal
from tests.integration.conftest import make_env, start_worker

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.docker,
    pytest.mark.redis,
    pytest.mark.celery,
]

ALL = pytest.mark.parametrize("harness", list(HARNESSES.values()), ids=list(HARNESSES))

ATTEMPTS = dict.fromkeys(HARNESSES, 1)
"""Model calls a limit refuses before it reaches the worker: one, for every CLI (the gateway
stops the turn at the first; without it, the pinned CLIs made 1 to 12 calls over up to two
minutes, and codex, claude-code and gemini reported no reset of a quota)."""
NO_RESET_ATTEMPTS = ATTEMPTS
QUOTA_RESET_REPORTED = frozenset(HARNESSES)
"""The API's reset reaches the worker from the wire, whatever the CLI says of it."""
RATE_RESET_REPORTED = frozenset(HARNESSES)


@pytest.fixture(scope="module")
def spend_deployment(
    clis_image_e2e: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """One worker on the Docker sandbox with host networking and the fake model server on
    loopback (this module's own: what it tests does not depend on the network mode), with
    backoffs of seconds instead of a fleet's minutes."""
    env = make_env(
        tmp_path_factory.mktemp("spend"),
        redis_url,
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="host",
        HARNESS_ALLOWED_NETWORKS="none,host",
        HARNESS_GRANTS=GRANTS,
        # The harnesses' --base-url is the fake model on loopback (operator policy).
        HARNESS_ALLOWED_BASE_URLS="127.0.0.1",
        HARNESS_RETENTION_S="3600",
        HARNESS_CONCURRENCY="4",
        HARNESS_BACKOFF_BASE_S="1",
        HARNESS_BACKOFF_MAX_S="2",
        HARNESS_SNAPSHOTS="false",
    )
    client = docker.from_env()
    with FakeModelServer() as fake:
        worker = start_worker(env, **WORKER_SECRETS)
        found = Deployment(env, worker, fake, env.client(), client)
        try:
            yield found
        finally:
            worker.stop()
            for container in client.containers.list(
                all=True,
                filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]},
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
            env.close()
            client.close()


@pytest.fixture
def e2e(spend_deployment: Deployment) -> Iterator[Deployment]:
    """The deployment; every run a test started is ended afterwards."""
    spend_deployment.made.clear()
    spend_deployment.fake.reset()
    yield spend_deployment
    for run_id in spend_deployment.made:
        with contextlib.suppress(Exception):
            spend_deployment.client.end(run_id, timeout=60)
    spend_deployment.made.clear()


def by_turn(followed: Followed) -> dict[int, list[dict[str, Any]]]:
    turns: dict[int, list[dict[str, Any]]] = {}
    for event in followed.events:
        turns.setdefault(int(str(event["id"]).split("-")[0]), []).append(event)
    return turns


def check_parked_then_completed(e2e: Deployment, followed: Followed, reason: str) -> int:
    """Every turn but the last parked the run on ``reason`` and its retry began at the reset
    or later; the last completed, with the fake model's answer. Returns the parks."""
    turns = by_turn(followed)
    numbers = sorted(turns)
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 2, followed.describe()
    for turn, events in turns.items():
        assert_one_terminal(events, turn)
    for turn in numbers[:-1]:
        events = turns[turn]
        (parked,) = [e["data"] for e in events if e["type"] == "parked"]
        assert parked["reason"] == reason and parked["next_turn"] == turn + 1
        assert events[-1]["data"]["reason"] == reason, followed.describe()
        assert turns[turn + 1][0]["ts"] >= parked["resume_at"] - 0.05  # not before the reset
    last = turns[numbers[-1]]
    assert last[-1]["type"] == "turn-complete", followed.describe()
    assert last[-1]["data"]["text"] == TEXT_ANSWER
    assert followed.returncode == 0, followed.describe()
    record = e2e.client.status(followed.run_id)
    assert (record["status"], record["parks"], record["resume_at"]) == (
        "idle",
        len(numbers) - 1,
        None,
    )
    return len(numbers) - 1


@ALL
def test_a_rate_limit_parks_the_run_which_resumes_at_the_reset_and_completes(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    prompt = f"[limited:http-429:{ATTEMPTS[harness.id]}:{word}] {word}"
    followed = e2e.run(harness, prompt, error=True)
    assert check_parked_then_completed(e2e, followed, "rate-limited") == 1
    error = next(e["data"] for e in followed.events if e["type"] == "session-error")
    if harness.id in RATE_RESET_REPORTED:
        assert error["retry_after_s"] == RESET_S, error
        (parked,) = [e for e in followed.events if e["type"] == "parked"]
        assert parked["data"]["resume_at"] - parked["ts"] <= RESET_S + 0.1
    second = [e for e in followed.events if e["id"].startswith("2-")]
    (session,) = [e["data"] for e in second if e["type"] == "session"]
    first = next(e["data"] for e in followed.events if e["type"] == "session")
    if session["resumed"]:  # the CLI kept the session of a turn that never got an answer
        assert session["session_id"] == first["session_id"]


@pytest.mark.parametrize(
    "harness", [HARNESSES[h] for h in NO_RESET_ATTEMPTS], ids=list(NO_RESET_ATTEMPTS)
)
def test_a_rate_limit_without_a_reset_parks_for_a_backoff(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    prompt = f"[limited:http-429:{NO_RESET_ATTEMPTS[harness.id]}:{word}:no-reset] {word}"
    followed = e2e.run(harness, prompt, error=True)
    assert check_parked_then_completed(e2e, followed, "rate-limited") == 1
    (parked,) = [e for e in followed.events if e["type"] == "parked"]
    assert 0.4 <= parked["data"]["resume_at"] - parked["ts"] <= 2.1  # HARNESS_BACKOFF_*


@ALL
def test_a_quota_with_a_reset_parks_when_the_cli_reports_it_else_is_not_retried(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    prompt = f"[limited:quota:{ATTEMPTS[harness.id]}:{word}] {word}"
    followed = e2e.run(harness, prompt, error=True)
    if harness.id in QUOTA_RESET_REPORTED:
        assert check_parked_then_completed(e2e, followed, "quota") == 1
        return
    check_not_retried(e2e, followed)


SPEND_CAP = list(HARNESSES)
"""opencode retried a quota as a rate limit, 9 calls over 77 s: the gateway stops it at the
first."""


@pytest.mark.parametrize("harness", [HARNESSES[h] for h in SPEND_CAP], ids=SPEND_CAP)
def test_a_quota_without_a_reset_is_a_spend_cap_and_is_not_retried(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    prompt = f"[limited:quota:1000:{word}:no-reset] {word}"  # were it retried, it would fail
    check_not_retried(e2e, e2e.run(harness, prompt, error=True))


def check_not_retried(e2e: Deployment, followed: Followed) -> None:
    assert followed.terminal["data"]["reason"] == "quota", followed.describe()
    assert followed.terminal["data"]["retryable"] is False
    assert all(e["type"] != "parked" for e in followed.events)
    record = e2e.client.status(followed.run_id)
    assert (record["status"], record["turns"], record["parks"]) == ("idle", 1, 0)


@ALL
def test_a_budget_of_a_few_tokens_stops_the_turn_midway_and_raising_it_resumes(
    e2e: Deployment, harness: Harness
) -> None:
    word = nonce()
    # The final answer is held back 5 s: the budget is crossed before it, whatever the load.
    # The shell tool is the scenario's: pi offers one only under dangerous (its auto posture has
    # none, and its turn would be one answer that a race decides); the others under auto.
    posture = ("--posture", "dangerous") if harness.id == "pi" else ()
    followed = e2e.run(
        harness, f"[scenario:tool] [final-delay:5] {word}", "--max-tokens", "5", *posture
    )
    terminal = followed.terminal["data"]
    assert terminal["reason"] == "budget", followed.describe()
    assert terminal["retryable"] is False
    # Midway: the model asked for the tool, and the CLI was stopped before its final answer
    # (it may have sent the tool's result to the model in the milliseconds before the stop).
    assert len(e2e.requests(word)) in (1, 2)
    texts = " ".join(str(t["text"]) for t in followed.of_type("assistant-text"))
    assert TOOL_FINAL_PREFIX not in texts, followed.describe()
    record = e2e.client.status(followed.run_id)
    assert record["budget_exceeded"]["budget"] == "max_tokens"
    assert record["status"] == "idle" and record["session_id"], record

    raised = e2e.cli("budget", followed.run_id, "--max-tokens", "1000000", "--json")
    assert raised.returncode == 0, raised.stderr
    assert json.loads(raised.stdout)["exceeded"] is None
    again = e2e.turn(followed.run_id, f"now just say hello {word}")
    assert again.terminal["type"] == "turn-complete", again.describe()
    (session,) = again.of_type("session")
    assert session["resumed"] is True and session["session_id"] == record["session_id"]
