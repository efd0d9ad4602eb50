"""Capabilities drive the runtime (docs/adapters.md, "Capabilities").

Two kinds of test, so that a flag can neither lie nor stop mattering:

- **The flag matters.** For each flag the runtime branches on, one test flips it on a real
  adapter (monkeypatched ``CAPABILITIES``) and watches the behaviour change: a refused
  ``--resume-session``, a warning for permission rules or a model the harness cannot apply,
  a system prompt moved into the input, a model echoed by the harness not reported.
- **A true flag is backed by behaviour.** For every harness and every flag it reports true,
  what the adapter does with the recorded output and the request shows it (never the
  constant compared with itself). What only the real CLI can show is in the conformance
  suite; docs/adapters.md names the test behind each capability.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import test_claude_code
import test_codex
import test_gemini
import test_opencode
import test_pi
from helpers import RecordedHarness, by_type, json_lines, replay

import adapters
from adapters import stdio_json
from adapters.events import Event, Session, TurnComplete, Usage
from adapters.protocol import Adapter, Command, ExitInfo, McpServer, TurnRequest
from config import Settings, load_settings
from worker.errors import InvalidInput
from worker.options.policy import fit_request, resolve
from worker.options.spec import RunOptions

pytestmark = pytest.mark.usefixtures("shipped_settings")

RECORDED: dict[str, RecordedHarness] = {
    r.harness_id: r
    for r in (
        test_claude_code.RECORDED,
        test_codex.RECORDED,
        test_gemini.RECORDED,
        test_opencode.RECORDED,
        test_pi.RECORDED,
    )
}
MARK = "CAPS-MARK-41c2"


@pytest.fixture
def settings() -> Settings:
    return load_settings(sandbox="local", allowed_executables=("*",))


@pytest.fixture
def flip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``flip(harness, **flags)``: that adapter declares ``flags`` for this test only."""

    def set_flags(harness: str, **flags: Any) -> Adapter:
        # The harness's adapter and its one-shot module (which the recordings replay).
        adapter = adapters.get(harness)
        flipped = dataclasses.replace(adapter.CAPABILITIES, **flags)
        one_shot = importlib.import_module(f"adapters.{adapters.MODULES[harness]}")
        for holder in {adapter, one_shot}:
            monkeypatch.setattr(holder, "CAPABILITIES", flipped)
        return adapter

    yield set_flags


def _options(harness: str, **fields: Any) -> RunOptions:
    if harness == "stdio-json":
        fields.setdefault("executable", "harness-demo")
    return RunOptions(harness=harness, sandbox="local", **fields)


def _everywhere(command: Command) -> str:
    """Everything a command hands the harness besides its input: argv, env, files."""
    return "\n".join([*command.argv, *command.env.values(), *command.files.values()])


# --- each flag matters --------------------------------------------------------------------


@pytest.mark.parametrize("can_resume", [True, False])
def test_session_resume_decides_whether_an_offered_session_is_refused(
    flip: Any, settings: Settings, can_resume: bool
) -> None:
    flip("claude-code", session_resume=can_resume)
    options = _options("claude-code", resume_session="sess-1")
    if can_resume:
        assert resolve(options, settings).warnings == ()
    else:
        with pytest.raises(InvalidInput, match=r"cannot resume.*session_resume"):
            resolve(options, settings)
    resolve(_options("claude-code"), settings)  # no session offered: never refused


@pytest.mark.parametrize("policy", ["full", "posture-only", "none"])
def test_permission_policy_decides_whether_rules_are_warned_about(
    flip: Any, settings: Settings, policy: str
) -> None:
    # claude-code's own adapter has nothing to add: what is warned comes from the flag.
    flip("claude-code", permission_policy=policy)
    with_rules = resolve(_options("claude-code", deny=("Bash(rm *)",)), settings).warnings
    strict_only = resolve(_options("claude-code", posture="strict"), settings).warnings
    if policy == "full":
        assert with_rules == strict_only == ()
    elif policy == "posture-only":
        (warning,) = with_rules
        assert "posture-only" in warning and "Bash(rm *)" in warning
        assert strict_only == ()  # the posture itself is applied
    else:
        (warning,) = with_rules
        assert "enforces no permission policy" in warning
        (warning,) = strict_only
        assert "'strict'" in warning


def test_an_adapter_that_knows_better_words_the_warning(settings: Settings) -> None:
    # pi (posture-only) names the patterns it cannot apply even to a whole tool.
    (inexact,) = resolve(_options("pi", deny=("Bash(rm *)",)), settings).warnings
    assert inexact.startswith("pi has no per-command permissions") and "Bash(rm *)" in inexact
    (whole,) = resolve(_options("pi", allow=("Bash",), deny=("Write",)), settings).warnings
    assert "posture-only" in whole and "whole tools" in whole


@pytest.mark.parametrize("selects", [True, False])
def test_model_selection_decides_whether_the_model_is_passed_or_warned(
    flip: Any, settings: Settings, selects: bool
) -> None:
    adapter = flip("claude-code", model_selection=selects)
    warnings = resolve(_options("claude-code", model="claude-x-1"), settings).warnings
    request = fit_request(TurnRequest("hi", model="claude-x-1"), adapter.CAPABILITIES)
    command = adapter.build_command(request)
    if selects:
        assert warnings == ()
        assert "claude-x-1" in command.argv
    else:
        (warning,) = warnings
        assert "model_selection" in warning and "claude-x-1" in warning
        assert "claude-x-1" not in _everywhere(command)


@pytest.mark.parametrize("harness", ["claude-code", "stdio-json"])
@pytest.mark.parametrize("has_channel", [True, False])
def test_system_prompt_flag_decides_between_its_channel_and_the_input(
    flip: Any, harness: str, has_channel: bool
) -> None:
    adapter = flip(harness, system_prompt=has_channel)
    request = TurnRequest("the question", system_prompt=MARK, executable="harness-demo")
    command = adapter.build_command(fit_request(request, adapter.CAPABILITIES))
    stdin = (command.stdin or b"").decode()
    if has_channel:
        assert stdin == "the question"
        # The adapter's channel (stdio-json has none: a harness declaring one gets it dropped,
        # which is why the flag must not lie).
        assert (MARK in _everywhere(command)) is (harness == "claude-code")
    else:
        assert stdin == f"{MARK}\n\nthe question"
        assert MARK not in _everywhere(command)


@pytest.mark.parametrize(("harness", "reports"), [("claude-code", False), ("pi", True)])
def test_model_reporting_decides_whether_the_mapped_model_is_published(
    flip: Any, harness: str, reports: bool
) -> None:
    """Flip each harness's real flag: claude-code's reported model disappears, pi's echo of
    the requested model appears."""
    recorded = RECORDED[harness]

    def models() -> set[str | None]:
        events, _ = recorded.run("text")
        return {e.model for e in events if isinstance(e, Session | TurnComplete)}

    before = models()
    flip(harness, model_reporting=reports)
    after = models()
    if reports:  # pi declares false: its echo is hidden; flipped, the echo is published
        assert (before, after) == ({None}, {"fake-model"})
    else:  # claude-code declares true: the model it names; flipped, none
        assert before != {None} and after == {None}


# --- every true flag is backed by behaviour -----------------------------------------------

EACH_HARNESS = list(adapters.HARNESS_IDS)


def _caps(harness: str) -> dict[str, Any]:
    return adapters.capabilities(harness)


def _stdio_events(*messages: dict[str, Any], request: TurnRequest) -> list[Event]:
    events, _ = replay(stdio_json, request, json_lines(*messages), ExitInfo(0))
    return events


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_session_resume_true_offers_the_session_and_knows_it_resumed(harness: str) -> None:
    if not _caps(harness)["session_resume"]:
        pytest.skip(f"{harness} declares no session_resume")
    adapter = adapters.get(harness)
    offered = TurnRequest("q", resume_session="sess-4f1", model="m", executable="x")
    assert "sess-4f1" in _everywhere(adapter.build_command(offered))
    if harness == "stdio-json":
        events = _stdio_events(
            {"type": "session", "id": "sess-4f1"}, {"type": "complete"}, request=offered
        )
    else:
        events, _ = RECORDED[harness].run("resume")
    (session,) = by_type(events, "session")
    assert session.resumed is True


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_system_prompt_true_goes_through_a_channel_not_the_input(harness: str) -> None:
    if not _caps(harness)["system_prompt"]:
        pytest.skip(f"{harness} declares no system-prompt channel")
    adapter = adapters.get(harness)
    command = adapter.build_command(TurnRequest("q", system_prompt=MARK, model="m"))
    assert MARK in _everywhere(command)
    assert MARK not in (command.stdin or b"").decode()


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_model_selection_true_hands_the_model_to_the_harness(harness: str) -> None:
    if not _caps(harness)["model_selection"]:
        pytest.skip(f"{harness} declares no model_selection")
    command = adapters.get(harness).build_command(TurnRequest("q", model="model-7e2"))
    assert "model-7e2" in _everywhere(command)


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_usage_and_cost_reporting_true_come_out_of_a_recorded_turn(harness: str) -> None:
    caps = _caps(harness)
    if harness == "stdio-json":
        request = TurnRequest("q", executable="x")
        usage = {"type": "usage", "input_tokens": 3, "output_tokens": 2, "cost_usd": 0.5}
        events = _stdio_events(usage, {"type": "complete"}, request=request)
    else:
        # A priced model: the request names none of ours (pi prices only its own models).
        events, _ = RECORDED[harness].run("text", base_url=None)
    usages = [e for e in events if isinstance(e, Usage)]
    if caps["usage_reporting"]:
        assert usages and sum(u.input_tokens + u.output_tokens for u in usages) > 0
    if caps["cost_reporting"]:  # the fake model's price is 0: priced, at nothing
        assert any(u.cost_usd is not None for u in usages)
    else:
        assert all(u.cost_usd is None for u in usages)


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_model_reporting_true_reports_a_model_and_false_none(harness: str) -> None:
    """A true flag reports the model the harness names; that it is the model that answered
    and not the one requested is shown live (tests/conformance, ``answer-model``)."""
    if harness == "stdio-json":
        request = TurnRequest("q", executable="x")
        events = _stdio_events(
            {"type": "session", "id": "s", "model": "m-1"}, {"type": "complete"}, request=request
        )
    else:
        events, _ = RECORDED[harness].run("text")
    models = {e.model for e in events if isinstance(e, Session | TurnComplete)}
    assert (models != {None}) is _caps(harness)["model_reporting"]


@pytest.mark.parametrize("harness", EACH_HARNESS)
@pytest.mark.parametrize("flag", ["permission_hooks"])
def test_flags_nothing_implements_are_false(harness: str, flag: str) -> None:
    """No adapter asks us mid-turn through hooks: a harness declaring it true needs the
    runtime that backs it (and a test of it here) first."""
    assert _caps(harness)[flag] is False


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_mcp_client_true_hands_the_runs_servers_to_the_harness(harness: str) -> None:
    """True: the run's servers (the bridge to its endpoint) are in the harness's own MCP
    configuration, the credential passed by name only; that the CLI loads them and calls a
    tool is shown live (tests/conformance/test_tools_live.py). False: nothing is configured
    (and the worker refuses such a run its tools)."""
    bridge = ("python3", "/w/.home/.harness/mcp-bridge.py", "/w/.home/.harness/mcp.sock", "orders")
    server = McpServer("orders", bridge, env=("HARNESS_RUN_TOKEN",))
    request = TurnRequest("q", model="m", executable="x", mcp_servers=(server,))
    configured = _everywhere(adapters.get(harness).build_command(request))
    if _caps(harness)["mcp_client"]:
        assert "mcp-bridge.py" in configured and "mcp.sock" in configured
    else:
        assert "mcp-bridge.py" not in configured
