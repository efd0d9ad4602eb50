"""Harness adapters: pure argv builders and message mappers, one module per harness.

``get(harness_id)`` returns the adapter module; ``capabilities(harness_id)`` what it
really implements. Modules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from adapters.protocol import Adapter, AdapterState

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

HARNESS_IDS: tuple[str, ...] = tuple(MODULES)


class UnknownHarness(ValueError):
    def __init__(self, harness_id: str) -> None:
        super().__init__(
            f"unknown harness {harness_id!r}; known harnesses: {', '.join(HARNESS_IDS)}"
        )
        self.harness_id = harness_id


def get(harness_id: str) -> Adapter[AdapterState]:
    """The adapter module of ``harness_id``; its state is an :class:`AdapterState`."""
    module = MODULES.get(harness_id)
    if module is None:
        raise UnknownHarness(harness_id)
    return cast(Adapter[AdapterState], importlib.import_module(f"adapters.{module}"))


def capabilities(harness_id: str) -> dict[str, Any]:
    return get(harness_id).CAPABILITIES.as_dict()
