"""adapters.errors: API error text and status → session-error reason."""

from __future__ import annotations

import pytest

from adapters.errors import classify, error_event, retry_after_in, status_in


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("unexpected status 401 Unauthorized: invalid api key, url: http://x/v1/responses", 401),
        ('[API Error: {"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}]', 429),
        ("Failed to authenticate. API Error: 401 {}", 401),
        ("API Error: 529 overloaded", 529),
        ('{"statusCode": 503}', 503),
        ("run_shell_command_1796002268505_0 finished", None),
        ("exit code 1", None),
    ],
)
def test_status_in_finds_http_error_status_when_named(text: str, status: int | None) -> None:
    assert status_in(text) == status


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("retry-after: 30", 30.0),
        ('"retryDelay": "12s"', 12.0),
        ("Please retry in 28.5s.", 28.5),
        ("try again in 5 minutes", 300.0),
        ("retry after 1500ms", 1.5),
        ("try again in 2h", 7200.0),
        ("try again later", None),
    ],
)
def test_retry_after_in_reads_delay_when_stated(text: str, seconds: float | None) -> None:
    assert retry_after_in(text) == seconds


@pytest.mark.parametrize(
    ("text", "status", "reason", "retryable"),
    [
        ("unexpected status 401 Unauthorized", None, "auth", False),
        ("forbidden", 403, "auth", False),
        ('{"error":{"status":"UNAUTHENTICATED"}}', None, "auth", False),
        ("authentication_failed", None, "auth", False),
        ("Too Many Requests", 429, "rate-limited", True),
        ("Overloaded", 529, "rate-limited", True),
        ("The model is overloaded", None, "rate-limited", True),
        ("You exceeded your current quota (insufficient_quota)", 429, "quota", False),
        ("Your credit balance is too low", 400, "quota", False),
        ("RESOURCE_EXHAUSTED: Quota exceeded for metric requests per day", 429, "quota", False),
        ("RESOURCE_EXHAUSTED: Quota exceeded: requests per minute", 429, "rate-limited", True),
        ("Internal Server Error", 500, "harness-error", True),
        ("something broke", None, "harness-error", False),
    ],
)
def test_classify_gives_contract_reason_for_api_errors(
    text: str, status: int | None, reason: str, retryable: bool
) -> None:
    found = classify(text, status)
    assert (found.reason, found.retryable) == (reason, retryable)


def test_classify_quota_is_retryable_when_reset_time_known() -> None:
    found = classify("You've hit your usage limit. Try again in 20 minutes.")
    assert (found.reason, found.retryable, found.retry_after_s) == ("quota", True, 1200.0)


def test_classify_rate_limit_carries_retry_after_when_stated() -> None:
    assert classify("rate_limit_error, retry-after: 7", 429).retry_after_s == 7.0


def test_error_event_builds_classified_session_error() -> None:
    event = error_event("API Error: 429 slow down", exit_code=1, stderr_tail="tail")
    assert event.reason == "rate-limited"
    assert event.retryable is True
    assert event.exit_code == 1
    assert event.stderr_tail == "tail"


def test_classify_unreachable_api_is_retryable_harness_error() -> None:
    found = classify("API Error: Connection refused (ECONNREFUSED)")
    assert (found.reason, found.retryable) == ("harness-error", True)


def test_classify_codex_server_error_wording_is_retryable_harness_error() -> None:
    found = classify(
        "We\u2019re currently experiencing high demand, which may cause temporary errors."
    )
    assert (found.reason, found.retryable) == ("harness-error", True)


@pytest.mark.parametrize(
    ("text", "reason", "retry_after"),
    [
        (
            "[API Error: Resource has been exhausted (e.g. check quota).\n"
            "Suggested retry after 7s.]\nPlease wait and try again later.",
            "rate-limited",
            7.0,
        ),
        ("[API Error: You have exhausted your daily quota on this model.]", "quota", None),
    ],
)
def test_classify_gemini_cli_wording(text: str, reason: str, retry_after: float | None) -> None:
    found = classify(text)
    assert (found.reason, found.retry_after_s) == (reason, retry_after)
