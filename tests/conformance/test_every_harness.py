"""The live scenarios whose steps and checks are the same for every harness (or for every
harness named), each run against the real CLIs. Each harness's own file says how the
scenarios address it (``LIVE``) and tests what only that harness does."""

from __future__ import annotations

import pytest

from adapters.events import Session
from tests.conformance import test_claude_code, test_codex, test_gemini, test_opencode, test_pi
from tests.conformance.conftest import RunLiveTurn
from tests.conformance.shared_scenarios import (
    PLAIN_SYSTEM_PROMPT,
    QUOTED_SYSTEM_PROMPT,
    LiveHarness,
    first_turn_then_resume,
    system_prompt_call,
)
from tests.fakemodel.clis import HARNESSES, STALE_SESSION
from tests.helpers import assert_one_terminal

CLAUDE_CODE = test_claude_code.LIVE
CODEX = test_codex.LIVE
GEMINI = test_gemini.LIVE
OPENCODE = test_opencode.LIVE
PI = test_pi.LIVE


def each(*harnesses: LiveHarness) -> list[pytest.ParameterSet]:
    """The harnesses as test parameters, named by their ids."""
    return [pytest.param(harness, id=harness.harness_id) for harness in harnesses]


ALL = (CLAUDE_CODE, CODEX, GEMINI, OPENCODE, PI)
EVERY_HARNESS = each(*ALL)


def test_every_harness_with_a_cli_is_run_here() -> None:
    assert {harness.harness_id for harness in ALL} == set(HARNESSES)


@pytest.mark.parametrize(
    "harness",
    # codex's own file resumes a thread, checking the tokens it counts besides.
    each(CLAUDE_CODE, GEMINI, OPENCODE, PI),
)
def test_second_turn_resumes_the_session_with_prior_context(
    run_live_turn: RunLiveTurn, harness: LiveHarness
) -> None:
    first_turn_then_resume(run_live_turn, harness)


@pytest.mark.parametrize("harness", EVERY_HARNESS)
def test_stale_session_is_rejected_for_a_fresh_retry(
    run_live_turn: RunLiveTurn, harness: LiveHarness
) -> None:
    stale = STALE_SESSION[harness.harness_id]
    turn = run_live_turn(harness.harness_id, harness.ask("hi", resume_session=stale))
    assert turn.error.reason == "harness-error"
    if harness.stale_session_exit_code is not None:
        assert turn.error.exit_code == harness.stale_session_exit_code
    assert turn.state.resume_rejected is True
    assert turn.of_type("session") == []
    assert turn.model_requests() == []


@pytest.mark.parametrize(
    ("harness", "prompt"),
    # gemini's own file checks its system prompt keeps the tool list besides.
    [
        pytest.param(CLAUDE_CODE, PLAIN_SYSTEM_PROMPT, id=CLAUDE_CODE.harness_id),
        pytest.param(CODEX, QUOTED_SYSTEM_PROMPT, id=CODEX.harness_id),
        pytest.param(OPENCODE, QUOTED_SYSTEM_PROMPT, id=OPENCODE.harness_id),
        pytest.param(PI, QUOTED_SYSTEM_PROMPT, id=PI.harness_id),
    ],
)
def test_system_prompt_lands_in_the_system_slot_not_the_user_message(
    run_live_turn: RunLiveTurn, harness: LiveHarness, prompt: str
) -> None:
    system_prompt_call(run_live_turn, harness, prompt)


@pytest.mark.parametrize("harness", each(OPENCODE, PI))
def test_dropped_connection_ends_the_turn_with_one_terminal(
    run_live_turn: RunLiveTurn, harness: LiveHarness
) -> None:
    turn = run_live_turn(harness.harness_id, harness.ask("[scenario:truncated] hi"), timeout=150)
    assert_one_terminal(turn.events)


@pytest.mark.parametrize("harness", EVERY_HARNESS)
def test_turn_stopped_mid_stream_leaves_a_resumable_session(
    run_live_turn: RunLiveTurn, harness: LiveHarness
) -> None:
    first = run_live_turn(harness.harness_id, harness.ask("remember the word HERON"))
    session_id = first.complete.session_id
    stopped = run_live_turn(
        harness.harness_id,
        harness.ask("[scenario:slow] [delay:5] go on", turn=2, resume_session=session_id),
        placement=first.placement,
        timeout=harness.stopped_turn_timeout_s,
    )
    assert stopped.timed_out and stopped.error.reason == "timeout"
    third = run_live_turn(
        harness.harness_id,
        harness.ask("and now?", turn=3, resume_session=session_id),
        placement=first.placement,
    )
    session = third.of_type("session")[0]
    assert isinstance(session, Session) and session.resumed is True
    assert any("HERON" in t for t in harness.agent_calls(third)[-1].user_texts())
