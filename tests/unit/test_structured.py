"""The worker's check of a turn's answer against its output schema (worker/turn/structured.py),
and ``structured`` in ``turn-complete``'s data."""

from __future__ import annotations

import pytest

from adapters.events import SessionError, TurnComplete, parse_event, session_error
from worker.turn import structured

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string"}, "score": {"type": "integer", "minimum": 0}},
    "required": ["verdict", "score"],
    "additionalProperties": False,
}


def complete(text: str, **fields: object) -> TurnComplete:
    return TurnComplete(text=text, session_id="s1", exit_code=0, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        '{"verdict": "ok", "score": 3}',
        '  \n{"verdict": "ok", "score": 3}\n',
        'Here it is:\n```json\n{"verdict": "ok", "score": 3}\n```\nDone.',
        'Sure! {"verdict": "ok", "score": 3} is my answer.',
    ],
    ids=["plain", "blank-lines", "fenced", "embedded"],
)
def test_an_answer_that_validates_becomes_structured(text: str) -> None:
    checked = structured.check(complete(text), SCHEMA)
    assert isinstance(checked, TurnComplete)
    assert checked.structured == {"verdict": "ok", "score": 3}
    assert checked.text == text and checked.session_id == "s1"
    assert checked.data()["structured"] == {"verdict": "ok", "score": 3}


def test_the_value_an_adapter_found_apart_from_the_text_is_the_one_checked() -> None:
    given = complete("Done.", structured={"verdict": "ok", "score": 1})
    checked = structured.check(given, SCHEMA)
    assert isinstance(checked, TurnComplete) and checked.structured == {"verdict": "ok", "score": 1}
    wrong = structured.check(complete('{"verdict": "ok", "score": 1}', structured={"x": 1}), SCHEMA)
    assert isinstance(wrong, SessionError) and "'verdict' is a required property" in wrong.error


@pytest.mark.parametrize(
    ("text", "violation"),
    [
        ('{"verdict": "ok"}', "'score' is a required property (at the top level"),
        ('{"verdict": 42, "score": 1}', "42 is not of type 'string' (at /verdict"),
        ('{"verdict": "ok", "score": -1}', "-1 is less than the minimum of 0 (at /score"),
        ('[{"verdict": "ok", "score": 1}]', "is not of type 'object' (at the top level"),
    ],
    ids=["missing", "wrong-type", "out-of-range", "array"],
)
def test_an_answer_that_breaks_the_schema_is_invalid_output_naming_the_violation(
    text: str, violation: str
) -> None:
    checked = structured.check(complete(text), SCHEMA)
    assert isinstance(checked, SessionError)
    assert checked.reason == "invalid-output" and checked.retryable is False
    assert violation in checked.error
    assert "the answer does not match the turn's output schema" in checked.error
    assert checked.exit_code == 0


def test_an_answer_without_json_is_invalid_output_never_an_empty_turn_complete() -> None:
    checked = structured.check(complete("Hello from the fake model."), SCHEMA)
    assert isinstance(checked, SessionError) and checked.reason == "invalid-output"
    assert "holds no JSON value" in checked.error
    assert "'Hello from the fake model.'" in checked.error
    long = structured.check(complete("x" * 5000), SCHEMA)
    assert isinstance(long, SessionError) and len(long.error) < 400


def test_without_a_schema_or_a_turn_complete_nothing_changes() -> None:
    plain = complete("not json")
    assert structured.check(plain, None) is plain
    failed = session_error("boom", "exit")
    assert structured.check(failed, SCHEMA) is failed


def test_structured_is_left_out_of_the_data_without_a_schema_and_round_trips() -> None:
    assert "structured" not in complete("hi").data()
    event = complete("[1, 2]", structured=[1, 2])
    assert event.data()["structured"] == [1, 2]
    assert parse_event("turn-complete", event.data()) == event
    for value in (True, 7, 2.5, "text", {"a": {"b": [None]}}):
        again = parse_event("turn-complete", complete("x", structured=value).data())
        assert isinstance(again, TurnComplete) and again.structured == value
        assert type(again.structured) is type(value)
