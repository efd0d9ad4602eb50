"""Text read together, published together: the stream driver's merge of consecutive
``assistant-text`` (``StreamDriver.coalesce_chars``, ``HARNESS_COALESCE_TEXT_CHARS``)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters import stdio_json
from adapters.events import AssistantText, Event, session_error
from adapters.protocol import ExitInfo, TextMessages, TurnRequest
from adapters.stream import StreamDriver
from tests.unit.test_stream_driver import FakeAdapter


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _text(value: str) -> bytes:
    return _line({"type": "text", "text": value})


def _driver(bound: int, adapter: Any = None) -> StreamDriver:
    request = TurnRequest(input="hello", executable="x")
    return StreamDriver(adapter or stdio_json, request, coalesce_chars=bound)


def _shape(events: list[Event]) -> list[str]:
    return [e.text if isinstance(e, AssistantText) else e.type for e in events]


def test_consecutive_text_merges_up_to_the_bound_and_keeps_the_order() -> None:
    driver = _driver(4)
    chunk = b"".join(
        [
            _text("ab"),
            _text("cd"),
            _text("ef"),
            _line({"type": "activity", "kind": "command", "description": "ls"}),
            _text("gh"),
            _line({"type": "usage", "input_tokens": 1, "output_tokens": 2}),
            _text("ij"),
        ]
    )
    events = driver.feed(chunk)
    assert _shape(events) == ["turn-started", "abcd", "ef", "sandbox-activity", "gh", "usage"]
    assert _shape(driver.release_text()) == ["ij"]
    assert driver.release_text() == []
    assert all(type(e) is AssistantText for e in events if e.type == "assistant-text")
    assert driver.counters.events == 6  # the entries made, not the lines read
    assert driver.counters.messages == 7


def test_a_text_longer_than_the_bound_stays_whole() -> None:
    driver = _driver(4)
    events = driver.feed(_text("a") + _text("x" * 10))
    assert _shape(events) == ["turn-started", "a"]
    assert _shape(driver.release_text()) == ["x" * 10]


def test_held_text_goes_before_the_terminal_whichever_way_the_turn_ends() -> None:
    finished = _driver(1024)
    finished.feed(_text("one") + _text("two"))
    assert _shape(finished.finish(ExitInfo(0, ""))) == ["onetwo", "session-error"]

    completed = _driver(1024)
    events = completed.feed(_text("one") + _line({"type": "complete", "text": "done"}))
    assert _shape(events) == ["turn-started", "one", "turn-complete"]

    failed = _driver(1024)
    failed.feed(_text("one"))
    assert _shape(failed.fail(session_error("cancelled", "cancelled"))) == [
        "one",
        "session-error",
    ]


def test_text_after_the_terminal_is_dropped_not_held() -> None:
    driver = _driver(1024)
    driver.feed(_line({"type": "complete", "text": "done"}) + _text("late"))
    assert driver.release_text() == []
    assert driver.counters.dropped_after_terminal == 1


def test_a_mode_without_text_messages_is_merged_from_its_events() -> None:
    adapter = FakeAdapter()
    assert not isinstance(adapter, TextMessages)
    driver = _driver(6, adapter)
    events = driver.feed(
        _line({"say": "ab"})
        + _line({"say": "cd"})
        + _line({"many": [{"say": "ef"}, {"say": "gh"}]})
        + _line({"done": "end"})
    )
    assert _shape(events) == ["turn-started", "abcdef", "gh", "turn-complete"]


def test_without_a_bound_every_text_line_is_its_own_event() -> None:
    driver = _driver(0)
    events = driver.feed(_text("a") + _text("b"))
    assert _shape(events) == ["turn-started", "a", "b"]
    assert driver.release_text() == []


@given(
    st.lists(st.text(max_size=40), max_size=60),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=300),
)
def test_nothing_is_lost_or_reordered_across_chunks(texts: list[str], bound: int, cut: int) -> None:
    """Fed in slices that cut lines anywhere, released after each slice as the worker does:
    the text comes out whole, in order, in events within the bound (or a single line)."""
    driver = _driver(bound)
    data = b"".join(_text(t) for t in texts)
    out: list[Event] = []
    for at in range(0, len(data), cut):
        out += driver.feed(data[at : at + cut])
        out += driver.release_text()
    merged = [e.text for e in out if isinstance(e, AssistantText)]
    assert "".join(merged) == "".join(texts)
    assert all(len(m) <= bound or m in texts for m in merged)
    assert all(m for m in merged)


@given(
    st.dictionaries(
        st.sampled_from(["type", "text", "id", "kind"]),
        st.one_of(
            st.sampled_from(["text", "session", "activity", "complete", "other"]),
            st.text(max_size=5),
            st.integers(),
            st.none(),
            st.lists(st.integers(), max_size=2),
        ),
    )
)
def test_stdio_json_text_message_says_what_its_mapper_does(message: dict[str, Any]) -> None:
    """The driver takes a text line through ``text_message`` without the mapper: both must
    read every message the same way, whatever its fields hold."""
    text = stdio_json.text_message(message)
    if text is None:
        return
    state = stdio_json.new_state(TurnRequest(input="x", executable="x"))
    assert stdio_json.map_message(message, state) == ([AssistantText(text=text)] if text else [])


def test_a_flood_of_lines_is_a_few_events() -> None:
    driver = _driver(4096)
    lines = [f"line {i}\n" for i in range(1000)]
    events = driver.feed(b"".join(_text(line) for line in lines)) + driver.release_text()
    texts = [e.text for e in events if isinstance(e, AssistantText)]
    assert "".join(texts) == "".join(lines)
    assert len(texts) == 3 and all(len(t) <= 4096 for t in texts)
