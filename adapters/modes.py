"""A harness whose ``--posture ask`` is another CLI mode: its adapter, chosen per turn.

Every harness but stdio-json asks us for permissions only in a mode of their own (``gemini --acp``,
``opencode acp``, ``codex app-server``, ``pi --mode rpc``, ``claude -p`` with its stdin
control channel), so each has two modules: the one-shot mapper (``adapters/<harness>.py``)
and the ask-mode client beside it. :class:`ByPosture` is what ``adapters.get`` returns for
them: it builds the turn of the mode its request's posture picks and hands every later call
to the mode that made the turn's state (the ask mode's state is its own class).
"""

from __future__ import annotations

from typing import Any

from adapters.asks import Ask, Decision
from adapters.events import Event
from adapters.protocol import (
    Adapter,
    AdapterState,
    Capabilities,
    Command,
    ExitInfo,
    Mode,
    TurnRequest,
)


class ByPosture:
    """The adapter of a harness with a one-shot mode and an ask mode (an :class:`Adapter`).

    ``HARNESS_ID`` and ``CAPABILITIES`` are the one-shot module's: the capabilities are the
    harness's, whichever mode a turn runs in.
    """

    def __init__(
        self, one_shot: Mode[Any], ask: Adapter[Any], ask_state: type[AdapterState]
    ) -> None:
        self.HARNESS_ID: str = one_shot.HARNESS_ID
        self.CAPABILITIES: Capabilities = one_shot.CAPABILITIES
        self._one_shot, self._ask, self._ask_state = one_shot, ask, ask_state

    def _mode(self, request: TurnRequest) -> Mode[Any]:
        return self._ask if request.posture == "ask" else self._one_shot

    def _of(self, state: AdapterState) -> Mode[Any]:
        return self._ask if isinstance(state, self._ask_state) else self._one_shot

    def new_state(self, request: TurnRequest) -> AdapterState:
        state: AdapterState = self._mode(request).new_state(request)
        return state

    def build_command(self, request: TurnRequest) -> Command:
        return self._mode(request).build_command(request)

    def map_message(self, message: dict[str, Any], state: AdapterState) -> list[Event]:
        return self._of(state).map_message(message, state)

    def finish(self, state: AdapterState, exit: ExitInfo) -> list[Event]:
        return self._of(state).finish(state, exit)

    def answer(self, state: AdapterState, ask: Ask, decision: Decision) -> None:
        # Only the ask mode's mapper leaves anything in state.asks.
        self._ask.answer(state, ask, decision)

    def steer(self, state: AdapterState, text: str) -> bool:
        # Only the ask mode keeps the harness's stdin open for the turn.
        if not isinstance(state, self._ask_state):
            return False
        return bool(self._ask.steer(state, text))

    def policy_warning(self, request: TurnRequest) -> str | None:
        return self._mode(request).policy_warning(request)
