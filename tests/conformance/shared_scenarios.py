"""What the conformance files of the five harnesses share, written once.

- :class:`LiveHarness`: how the shared scenarios address one harness (its model, which model
  calls answer a turn, how long it takes to start); each harness's file declares its ``LIVE``.
- Scenarios several harnesses run with the same steps: each runs live turns through the
  ``run_live_turn`` fixture, asserts what every harness must do, and returns what it made for
  the harness's own file to assert what only that harness does.
- The checks of a turn's outcome that the files make alike.

The scenarios whose steps and checks are the same for every harness are the parametrised
tests of ``test_every_harness.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.events import SandboxActivity, Session, TurnComplete, Usage
from adapters.protocol import TurnRequest
from tests.conformance.conftest import ApiError, LiveTurn, RunLiveTurn
from tests.fakemodel import TEXT_ANSWER, USAGE, RecordedRequest

#: System prompts to find again in the request: a plain one, and one a careless quoting
#: (shell, TOML, JSON) would break.
PLAIN_SYSTEM_PROMPT = "SYSTEM-MARKER-7f3a: answer in French."
QUOTED_SYSTEM_PROMPT = 'SYSTEM-MARKER-7f3a: "quoted" \\ and\nnewline'


@dataclass(frozen=True)
class LiveHarness:
    """How the shared scenarios address one harness's CLI."""

    harness_id: str
    model: str | None = None
    """The model every request names (``None``: the CLI's default)."""
    titles_new_sessions: bool = False
    """The CLI makes a side call to title a new session (opencode): no agent-loop call."""
    one_call_per_answer: bool = True
    """A plain answer takes exactly one model call; otherwise the answer is the last call."""
    stopped_turn_timeout_s: float = 8.0
    """When a turn stopped mid-stream is cut off (s): late enough for the CLI to have
    started answering, before the slow answer ends."""
    stale_session_exit_code: int | None = None
    """The exit code a stale session's error carries (``None``: not checked)."""

    def ask(self, text: str, **fields: Any) -> TurnRequest:
        """A request with ``text`` as input, naming the harness's model (if any)."""
        if self.model is not None:
            fields.setdefault("model", self.model)
        return TurnRequest(input=text, **fields)

    def agent_calls(self, turn: LiveTurn) -> list[RecordedRequest]:
        """The turn's model calls of the agent loop (without session-title side calls)."""
        calls = turn.model_requests()
        if not self.titles_new_sessions:
            return calls
        return [
            r for r in calls if not any(t.startswith("Generate a title") for t in r.user_texts())
        ]

    def answer_call(self, turn: LiveTurn) -> RecordedRequest:
        """The model call that answered the turn."""
        calls = self.agent_calls(turn)
        if self.one_call_per_answer:
            (call,) = calls
            return call
        return calls[-1]


# --------------------------------------------------------------------------- checks
def answered_text_turn(turn: LiveTurn) -> tuple[TurnComplete, Session, Usage]:
    """A first turn's plain answer: the fake model's text, one new session (the one the
    answer names) and one usage report with the fake model's token counts."""
    done = turn.complete
    assert done.text == TEXT_ANSWER
    (session,) = turn.of_type("session")
    assert isinstance(session, Session)
    assert (session.session_id, session.resumed) == (done.session_id, False)
    (usage,) = turn.of_type("usage")
    assert isinstance(usage, Usage)
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens,
        USAGE.cached_input_tokens,
        USAGE.output_tokens,
    )
    return done, session, usage


def assert_one_command_ran(turn: LiveTurn) -> None:
    """The turn reported one activity: the fake model's shell command."""
    (activity,) = turn.of_type("sandbox-activity")
    assert isinstance(activity, SandboxActivity)
    assert activity.kind == "command" and "tool-ran" in activity.description


# --------------------------------------------------------------------------- scenarios
def first_turn_then_resume(
    run_live_turn: RunLiveTurn, harness: LiveHarness
) -> tuple[LiveTurn, LiveTurn]:
    """A first turn asking the model to remember a word, then a second in the same
    placement resuming its session (with what the first left in ``carry``) that asks for
    the word. The second must continue the session and send the model the first turn's
    conversation."""
    first = run_live_turn(harness.harness_id, harness.ask("remember the word PELICAN"))
    session_id = first.complete.session_id
    request = harness.ask(
        "what was the word?", turn=2, resume_session=session_id, carry=first.state.carry
    )
    second = run_live_turn(harness.harness_id, request, placement=first.placement)
    assert second.complete.session_id == session_id
    (session,) = second.of_type("session")
    assert isinstance(session, Session)
    assert session.resumed is True and second.state.resume_rejected is False
    call = harness.answer_call(second)
    assert any("PELICAN" in text for text in call.user_texts())
    assert TEXT_ANSWER in call.assistant_texts()
    return first, second


def system_prompt_call(
    run_live_turn: RunLiveTurn, harness: LiveHarness, prompt: str, **fields: Any
) -> RecordedRequest:
    """A turn with ``prompt`` as system prompt: the call that answered it carries the
    prompt in its system slot and in no user message."""
    turn = run_live_turn(harness.harness_id, harness.ask("hi", system_prompt=prompt, **fields))
    turn.complete  # noqa: B018 -- raises with the details when the turn failed
    call = harness.answer_call(turn)
    assert prompt in call.system_text()
    assert all(prompt not in text for text in call.user_texts())
    return call


def large_input_call(
    run_live_turn: RunLiveTurn, harness: LiveHarness, text: str
) -> RecordedRequest:
    """A turn with ``text`` (large, starting with a dash) as input that must complete; the
    call that answered it, for the harness's file to find the input in."""
    turn = run_live_turn(harness.harness_id, harness.ask(text))
    turn.complete  # noqa: B018
    return harness.answer_call(turn)


def api_error_turn(
    run_live_turn: RunLiveTurn, harness: LiveHarness, api_error: ApiError, **options: Any
) -> LiveTurn:
    """A turn whose model API fails as ``api_error`` says: it must end with a session-error
    of the reason that error calls for, retryable or not as it says. ``options`` go to
    ``run_live_turn`` (a timeout that outlasts the CLI's own retries, secrets)."""
    prompt = f"[scenario:{api_error.scenario}] hi"
    turn = run_live_turn(harness.harness_id, harness.ask(prompt), **options)
    error = turn.error
    expected = (api_error.reason, api_error.retryable)
    assert (error.reason, error.retryable) == expected, turn.describe()
    return turn
