"""opencode with ``--posture ask``: ``opencode acp`` (1.18.33), the ACP client of
:mod:`adapters.acp` over the harness's stdin/stdout.

The config is opencode's (:func:`adapters.opencode.setup`), its permissions
:data:`adapters.opencode.ASK_RULES` (every gated tool "ask", handed to us as
``session/request_permission``). ``acp`` takes no ``-m``: the model is chosen in the config.
The input rides in ``session/prompt`` and a resume is ``session/load``, so neither is in
argv. The exit is read as in the one-shot mode (:func:`adapters.opencode.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters import acp, opencode
from adapters.asks import Ask, Decision
from adapters.events import Event
from adapters.protocol import Command, TurnRequest

HARNESS_ID = opencode.HARNESS_ID
CAPABILITIES = opencode.CAPABILITIES


@dataclass(kw_only=True)
class State(opencode.State):
    channel: acp.Client
    """The turn's ACP conversation."""


def new_state(request: TurnRequest) -> State:
    # A model we describe ourselves (base_url) has no price: opencode reports 0 for it.
    return State(
        offered_session=request.resume_session,
        priced=request.base_url is None,
        channel=acp.client(request),
    )


def build_command(request: TurnRequest) -> Command:
    found = opencode.setup(request)
    if found.model:
        found.config["model"] = found.model
    argv = (request.executable or "opencode", "acp")
    first = acp.first_message()
    files = found.all_files()
    return Command(argv, first, found.env, files, request.workspace, keep_stdin=True)


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    return acp.map_message(message, state, state.channel)


def answer(state: State, ask: Ask, decision: Decision) -> None:
    acp.answer(state, ask, decision)


finish = opencode.finish
policy_warning = opencode.policy_warning


def steer(state: State, text: str) -> bool:
    """A second ``session/prompt``, which opencode queues into the running one
    (:func:`adapters.acp.steer`)."""
    return acp.steer(state, state.channel, text)
