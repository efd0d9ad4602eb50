"""A fake model server speaking the four vendor APIs the real harness CLIs call.

Anthropic Messages (claude-code), OpenAI Responses (codex), OpenAI Chat Completions (opencode,
pi) and Gemini ``generateContent`` (gemini), streaming SSE the way each CLI expects, scripted
by scenario (see :mod:`tests.fakemodel.scenarios`), with every request logged.

In tests::

    with FakeModelServer() as fake:
        ...  # point a CLI at fake.url; prompt "[scenario:tool] run it"
        assert fake.requests[0].api == "anthropic"

From a shell: ``python -m tests.fakemodel --port 18181 --scenario tool``.
"""

from tests.fakemodel.scenarios import (
    RETRY_AFTER_S,
    SCENARIOS,
    TEXT_ANSWER,
    TOOL_COMMAND,
    TOOL_FINAL_PREFIX,
    TOOL_OUTPUT,
    TRUNCATED_TEXT,
    USAGE,
)
from tests.fakemodel.server import ERROR_SCENARIOS, FakeModelServer, RecordedRequest

__all__ = [
    "ERROR_SCENARIOS",
    "RETRY_AFTER_S",
    "SCENARIOS",
    "TEXT_ANSWER",
    "TOOL_COMMAND",
    "TOOL_FINAL_PREFIX",
    "TOOL_OUTPUT",
    "TRUNCATED_TEXT",
    "USAGE",
    "FakeModelServer",
    "RecordedRequest",
]
