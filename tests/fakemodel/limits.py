"""Rate limits and quotas that end: the ``[limited:...]`` marker of the fake model server.

``[limited:SCENARIO:CALLS:KEY]`` (``SCENARIO`` is ``http-429`` or ``quota``): the first
``CALLS`` model calls whose current prompt carries this marker get that scenario's error
(counted under ``KEY``, so a retried turn, whatever else its conversation holds, meets the
same limit), then the server answers as usual. Counting calls rather than seconds lets a
test outlast a CLI's own retries (several of them retry a limit themselves before they give
up) without waiting for them. Each error announces a reset of ``RESET_S`` as real APIs do: a
``retry-after`` header, and the same in the error's text (OpenAI's "try again in Ns",
Gemini's ``RetryInfo``). ``[limited:SCENARIO:CALLS:KEY:no-reset]`` announces none.
"""

from __future__ import annotations

import copy
import re
import threading
from typing import Any

from tests.fakemodel.apis import ErrorReply
from tests.fakemodel.scenarios import RETRY_AFTER_S

MARKER = re.compile(r"\[limited:(http-429|quota):([0-9]+):([A-Za-z0-9_-]+)(:no-reset)?\]")
RESET_S = 1
"""The reset each limited call announces, in seconds."""


class Windows:
    """How many calls each named limit has refused (shared by the handler threads)."""

    def __init__(self) -> None:
        self._refused: dict[str, int] = {}
        self._lock = threading.Lock()

    def refuse(self, key: str, calls: int) -> bool:
        """Whether this call is refused: fewer than ``calls`` were, under ``key``."""
        with self._lock:
            refused = self._refused.get(key, 0)
            if refused >= calls:
                return False
            self._refused[key] = refused + 1
            return True

    def refused(self, key: str) -> int:
        with self._lock:
            return self._refused.get(key, 0)

    def clear(self) -> None:
        with self._lock:
            self._refused.clear()


def limited_reply(windows: Windows, handler: Any, prompt: str) -> ErrorReply | None:
    """The error for a call inside its window, or None (no marker, or the window is over)."""
    match = MARKER.search(prompt)
    if match is None:
        return None
    scenario, calls, key, no_reset = match.groups()
    if not windows.refuse(key, int(calls)):
        return None
    reply: ErrorReply = handler.error(scenario)
    headers = {k: v for k, v in reply.headers.items() if k.lower() != "retry-after"}
    body = copy.deepcopy(reply.body)
    error = body.get("error") if isinstance(body.get("error"), dict) else None
    if no_reset:
        if error is not None:
            error["message"] = _without_reset(str(error.get("message", "")))
            details = error.get("details")
            if isinstance(details, list):
                error["details"] = [d for d in details if "RetryInfo" not in str(d.get("@type"))]
        return ErrorReply(reply.status, headers, body)
    wait = RESET_S
    headers["retry-after"] = str(wait)
    if error is not None:
        message = _without_reset(str(error.get("message", "")))
        error["message"] = f"{message} Please try again in {wait}s."
        details = error.get("details")
        if isinstance(details, list):
            for detail in details:
                if "RetryInfo" in str(detail.get("@type")):
                    detail["retryDelay"] = f"{wait}s"
    return ErrorReply(reply.status, headers, body)


def _without_reset(message: str) -> str:
    return re.sub(rf"\s*Please try again in {RETRY_AFTER_S}s\.?", "", message).strip()
