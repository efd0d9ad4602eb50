"""Rate limits and quotas that end: the ``[limited:...]`` marker of the fake model server.

``[limited:SCENARIO:SECONDS:KEY]`` (``SCENARIO`` is ``http-429`` or ``quota``): every model
call whose current prompt carries this marker gets that scenario's error for ``SECONDS``
after the first such call (the window is named by ``KEY``, so a retried turn, whatever else
its conversation holds, meets the same window), then the server answers as usual. The reset
is announced as real APIs do: a ``retry-after`` header with the seconds left (at least 1),
and the same in the error's text (OpenAI's "try again in Ns", Gemini's ``RetryInfo``).
``[limited:SCENARIO:SECONDS:KEY:no-reset]`` announces none: the error says nothing of when.
"""

from __future__ import annotations

import copy
import math
import re
import threading
import time
from typing import Any

from tests.fakemodel.apis import ErrorReply
from tests.fakemodel.scenarios import RETRY_AFTER_S

MARKER = re.compile(
    r"\[limited:(http-429|quota):([0-9]+(?:\.[0-9]+)?):([A-Za-z0-9_-]+)(:no-reset)?\]"
)


class Windows:
    """When each named window opened (shared by the server's handler threads)."""

    def __init__(self) -> None:
        self._opened: dict[str, float] = {}
        self._lock = threading.Lock()

    def left(self, key: str, seconds: float) -> float:
        """Seconds this window stays shut (0 once it is over); the first call opens it."""
        now = time.monotonic()
        with self._lock:
            opened = self._opened.setdefault(key, now)
        return max(0.0, opened + seconds - now)

    def clear(self) -> None:
        with self._lock:
            self._opened.clear()


def limited_reply(windows: Windows, handler: Any, prompt: str) -> ErrorReply | None:
    """The error for a call inside its window, or None (no marker, or the window is over)."""
    match = MARKER.search(prompt)
    if match is None:
        return None
    scenario, seconds, key, no_reset = match.groups()
    left = windows.left(key, float(seconds))
    if left <= 0:
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
    wait = max(1, math.ceil(left))
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
