"""gemini with ``--posture ask``: ``gemini --acp`` (0.61.0), the ACP client of
:mod:`adapters.acp` over the harness's stdin/stdout.

The invocation is gemini's (:func:`adapters.gemini.invocation`: settings, policy file and
system prompt as in the one-shot mode) with ``--acp`` and the ``default`` approval mode, in
which every call the policy does not settle comes to us as ``session/request_permission``.
The input rides in ``session/prompt`` and a resume is ``session/load``, so neither is in
argv. The exit is read as in the one-shot mode (:func:`adapters.gemini.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters import acp, gemini
from adapters.asks import Ask, Decision
from adapters.events import Event
from adapters.protocol import AdapterState, Command, TurnRequest

HARNESS_ID = gemini.HARNESS_ID
CAPABILITIES = gemini.CAPABILITIES
_APPROVAL_MODE = "default"


@dataclass(kw_only=True)
class State(gemini.State):
    channel: acp.Client
    """The turn's ACP conversation."""


def new_state(request: TurnRequest) -> State:
    return State(offered_session=request.resume_session, channel=acp.client(request))


def build_command(request: TurnRequest) -> Command:
    argv, env, files = gemini.invocation(request, ("--acp",), _APPROVAL_MODE, resume=False)
    first = acp.first_message()
    return Command(tuple(argv), first, env, files, cwd=request.workspace, keep_stdin=True)


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    return acp.map_message(message, state, state.channel)


def answer(state: State, ask: Ask, decision: Decision) -> None:
    acp.answer(state, ask, decision)


finish = gemini.finish


def policy_warning(request: TurnRequest) -> str | None:
    return (
        "gemini --acp (0.61.0) may not find a session it saved over ACP when a later turn "
        "loads it: that turn then starts a fresh session with the run's prior "
        "conversation replayed"
    )


def steer(state: AdapterState, text: str) -> bool:
    """No channel: gemini 0.61.0 answers a second ``session/prompt`` mid-turn by cancelling
    the running one (its tool call gets no result, the turn ends ``cancelled``) and has no
    other: the worker emulates a steer (docs/adapters.md, "Steering")."""
    return False
