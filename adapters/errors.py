"""Classify a harness's API error into a ``session-error`` reason (docs/events.md, "Events").

Shared by every vendor adapter: each one finds the error in its own stream (an HTTP status
field, an error line, a stderr tail) and hands the status and text here. Pure functions.

* :func:`classify` — status code and/or text → :class:`Classification` (reason, retryable,
  retry_after_s). Status decides first (401/403 auth, 402 quota, 429 rate-limited unless the
  text says the quota or credits are gone, 529 rate-limited, 5xx harness-error but
  retryable); then the text (``overloaded``, ``insufficient_quota``,
  ``RESOURCE_EXHAUSTED``, ``UNAUTHENTICATED``, ``invalid api key``...); else
  ``harness-error``, retryable only when the API could not be reached (connection refused,
  reset, timed out) or said the fault is temporary.
* :func:`status_in` — the first HTTP error status a vendor message names (``401
  Unauthorized``, ``API Error: 429``, ``"code":503``, ``status 500``), or None.
* :func:`retry_after_in` — seconds to wait when the text says (``retry-after: 30``,
  ``"retryDelay": "12s"``, ``try again in 5m``), or None.
* :func:`error_event` — the ``session-error`` for a message, classified.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adapters.events import ErrorReason, SessionError, session_error

__all__ = ["Classification", "classify", "error_event", "retry_after_in", "status_in"]


@dataclass(frozen=True)
class Classification:
    reason: ErrorReason
    retryable: bool
    retry_after_s: float | None = None


_STATUS_PATTERNS = (
    re.compile(r"\bAPI Error:?\s*([1-5]\d\d)\b"),
    re.compile(
        r"\b([45]\d\d)\s+(?:Unauthorized|Forbidden|Payment Required|Too Many Requests|"
        r"Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)\b",
        re.I,
    ),
    re.compile(
        r"[\"']?(?:code|status|status_code|statusCode|error_status)[\"']?\s*[:=]?\s*"
        r"([45]\d\d)\b",
        re.I,
    ),
)
_RETRY_AFTER = re.compile(
    r"(?:retry[-_ ]?after|retryDelay|try again in|retry in|reset(?:s)? in)[\"':= ]*"
    r"(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)?\b",
    re.I,
)

_QUOTA = re.compile(
    r"insufficient_quota|quota exceeded|exceeded your (?:current )?quota|credit balance|"
    r"out of credits|usage limit|spend(?:ing)? limit|billing|payment required|"
    r"exhausted your (?:\w+ )?quota",
    re.I,
)
# Google names per-minute throttling "quota" too: that is a rate limit, not an empty wallet.
_PER_MINUTE = re.compile(r"per[ _]?minute|PerMinute|\bRPM\b|\bTPM\b", re.I)
_RATE = re.compile(
    r"rate[ _-]?limit|too many requests|overloaded|RESOURCE_EXHAUSTED|throttl|"
    r"resource has been exhausted",
    re.I,
)
_AUTH = re.compile(
    r"authentication_failed|authentication_error|UNAUTHENTICATED|PERMISSION_DENIED|"
    r"unauthori[sz]ed|invalid[ _-]?(?:api[ _-]?)?key|invalid x-api-key|api key not valid|"
    r"not logged in|please run /login|expired (?:token|credentials)",
    re.I,
)


_TRANSIENT = re.compile(
    r"ECONNREFUSED|ECONNRESET|ETIMEDOUT|connection (?:refused|reset|failed|error)|timed out|"
    r"temporary errors?|high demand",  # codex 0.169.0 words every 5xx this way
    re.I,
)


def status_in(text: str) -> int | None:
    """The HTTP error status a vendor message names, if any."""
    for pattern in _STATUS_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def retry_after_in(text: str) -> float | None:
    """Seconds until a retry may succeed, when the text says."""
    match = _RETRY_AFTER.search(text)
    if not match:
        return None
    value = float(match.group(1))
    unit = (match.group(2) or "s").lower()
    if unit.startswith(("ms", "milli")):
        return value / 1000
    if unit.startswith("h"):
        return value * 3600
    if unit.startswith("m"):
        return value * 60
    return value


def _quota_or_rate(text: str, retry_after: float | None) -> Classification:
    if _QUOTA.search(text) and not _PER_MINUTE.search(text):
        return Classification("quota", retry_after is not None, retry_after)
    return Classification("rate-limited", True, retry_after)


def classify(
    text: str = "", status: int | None = None, *, retry_after_s: float | None = None
) -> Classification:
    """The reason for an API error, from its HTTP status (when known) and its text."""
    if status is None:
        status = status_in(text)
    if retry_after_s is None:
        retry_after_s = retry_after_in(text)
    if status in (401, 403):
        return Classification("auth", False)
    if status == 402:
        return Classification("quota", retry_after_s is not None, retry_after_s)
    if status in (429, 529):
        return _quota_or_rate(text, retry_after_s)
    if _AUTH.search(text):
        return Classification("auth", False)
    if _QUOTA.search(text) or _RATE.search(text):
        return _quota_or_rate(text, retry_after_s)
    if status is not None and status >= 500:
        # A server fault the harness already retried: trying the turn again later may work.
        return Classification("harness-error", True, retry_after_s)
    # The API could not be reached: nothing the harness decided, so worth another try.
    return Classification("harness-error", bool(_TRANSIENT.search(text)), retry_after_s)


def error_event(
    message: str,
    *,
    status: int | None = None,
    text: str | None = None,
    exit_code: int | None = None,
    stderr_tail: str = "",
) -> SessionError:
    """A classified ``session-error``; ``text`` (default ``message``) is what is searched."""
    found = classify(message if text is None else text, status)
    return session_error(
        message,
        found.reason,
        retryable=found.retryable,
        retry_after_s=found.retry_after_s,
        exit_code=exit_code,
        stderr_tail=stderr_tail,
    )
