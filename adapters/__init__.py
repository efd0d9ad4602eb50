"""Harness adapters: pure argv builders and message mappers, one module per harness mode.

``get(harness_id)`` returns the harness's :class:`~adapters.protocol.Adapter`: its module,
or for a harness whose ``--posture ask`` is another CLI mode, a
:class:`~adapters.modes.ByPosture` over its one-shot module and its ask-mode module.
``capabilities(harness_id)`` is what it really implements. Modules are imported on first use.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any, cast

from adapters.modes import ByPosture
from adapters.protocol import Adapter, AdapterState, Mode

#: Harness id → module under ``adapters``. A harness id is also its fixture folder and
#: settings key.
MODULES: dict[str, str] = {
    "claude-code": "claude_code",
    "codex": "codex",
    "gemini": "gemini",
    "opencode": "opencode",
    "pi": "pi",
    "stdio-json": "stdio_json",
}

#: Harness id → the module of its ask mode, where that is another CLI mode than the one-shot
#: one (stdio-json asks in its one protocol).
ASK_MODULES: dict[str, str] = {
    "claude-code": "claude_control",
    "codex": "codex_app_server",
    "gemini": "gemini_acp",
    "opencode": "opencode_acp",
    "pi": "pi_rpc",
}

HARNESS_IDS: tuple[str, ...] = tuple(MODULES)


class UnknownHarness(ValueError):
    def __init__(self, harness_id: str) -> None:
        super().__init__(
            f"unknown harness {harness_id!r}; known harnesses: {', '.join(HARNESS_IDS)}"
        )
        self.harness_id = harness_id


@cache
def get(harness_id: str) -> Adapter[AdapterState]:
    """The adapter of ``harness_id`` (the same object on every call); its state is an
    :class:`AdapterState`."""
    module = MODULES.get(harness_id)
    if module is None:
        raise UnknownHarness(harness_id)
    one_shot = importlib.import_module(f"adapters.{module}")
    ask = ASK_MODULES.get(harness_id)
    if ask is None:
        return cast(Adapter[AdapterState], one_shot)
    ask_mode = importlib.import_module(f"adapters.{ask}")
    return ByPosture(
        cast(Mode[Any], one_shot), cast(Adapter[Any], ask_mode), ask_state=ask_mode.State
    )


def capabilities(harness_id: str) -> dict[str, Any]:
    return get(harness_id).CAPABILITIES.as_dict()
