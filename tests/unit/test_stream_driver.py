"""StreamDriver: the stream rules of docs/events.md ("Guarantees"), written once for every harness."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import stdio_json
from adapters.events import (
    AssistantText,
    Event,
    SessionError,
    TurnComplete,
    TurnStarted,
    session_error,
)
from adapters.protocol import AdapterState, Capabilities, Command, ExitInfo, TurnRequest
from adapters.stream import STDERR_TAIL_CHARS, StreamDriver

CAPS = Capabilities(
    session_resume=False,
    system_prompt=False,
    permission_policy="none",
    permission_hooks=False,
    mid_turn_cancel=False,
    usage_reporting=False,
    cost_reporting=False,
    model_selection=False,
    model_reporting=False,
    mcp_client=False,
)


@dataclass
class FakeState(AdapterState):
    seen: list[dict[str, Any]] = field(default_factory=list)


class FakeAdapter:
    """Maps ``{"say": T}`` to text, ``{"done": T}`` to turn-complete; ``{"boom": 1}`` raises;
    ``{"many": [...]}`` returns several events at once; finish() is configurable."""

    HARNESS_ID = "fake"
    CAPABILITIES = CAPS

    def __init__(
        self, finish_events: list[Event] | None = None, finish_raises: bool = False
    ) -> None:
        self.finish_events = finish_events or []
        self.finish_raises = finish_raises
        self.finish_calls = 0

    def new_state(self, request: TurnRequest) -> FakeState:
        return FakeState()

    def build_command(self, request: TurnRequest) -> Command:
        return Command(argv=("fake",))

    def map_message(self, message: dict[str, Any], state: FakeState) -> list[Event]:
        state.seen.append(message)
        if "boom" in message:
            raise KeyError("boom")
        if "say" in message:
            return [AssistantText(text=message["say"])]
        if "done" in message:
            return [TurnComplete(text=message["done"])]
        if "many" in message:
            return [_event(item) for item in message["many"]]
        return []

    def finish(self, state: FakeState, exit: ExitInfo) -> list[Event]:
        self.finish_calls += 1
        if self.finish_raises:
            raise RuntimeError("adapter bug in finish")
        return list(self.finish_events)

    def policy_warning(self, request: TurnRequest) -> str | None:
        return None


def _event(item: dict[str, str]) -> Event:
    kind, value = next(iter(item.items()))
    if kind == "say":
        return AssistantText(text=value)
    if kind == "done":
        return TurnComplete(text=value)
    if kind == "started":
        return TurnStarted(harness="evil", input_chars=0)
    return session_error(value, "harness-error")


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _driver(adapter: Any = None, **kwargs: Any) -> StreamDriver:
    return StreamDriver(
        adapter if adapter is not None else stdio_json,
        TurnRequest(input="hello", executable="x", resume_session=kwargs.pop("resume", None)),
        **kwargs,
    )


def _run(driver: StreamDriver, chunks: list[bytes], exit_code: int | None = 0) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        events.extend(driver.feed(chunk))
    events.extend(driver.finish(ExitInfo(exit_code, "")))
    return events


def _assert_turn_shape(events: list[Event]) -> None:
    assert events[0].type == "turn-started"
    assert [e.type for e in events].count("turn-started") == 1
    assert sum(e.terminal for e in events) == 1
    assert events[-1].terminal


TEXT = _line({"type": "text", "text": "hi"})
COMPLETE = _line({"type": "complete", "text": "done"})


def test_turn_started_first_and_once_when_start_called_twice() -> None:
    driver = _driver(attempt=2)
    first = driver.start()
    assert first == [TurnStarted(harness="stdio-json", attempt=2, input_chars=5)]
    assert driver.start() == []
    events = first + _run(driver, [TEXT, COMPLETE])
    _assert_turn_shape(events)


def test_turn_started_emitted_by_feed_when_start_not_called() -> None:
    events = _run(_driver(), [TEXT, COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]


def test_turn_started_emitted_by_finish_when_no_output() -> None:
    events = _driver().finish(ExitInfo(0, ""))
    assert [e.type for e in events] == ["turn-started", "session-error"]


def test_turn_started_from_adapter_ignored() -> None:
    events = _run(_driver(FakeAdapter()), [_line({"many": [{"started": ""}, {"say": "a"}]})])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "session-error"]
    assert isinstance(events[0], TurnStarted) and events[0].harness == "fake"


def test_blank_lines_skipped_without_counting() -> None:
    driver = _driver()
    events = _run(driver, [b"\n", b"   \n", b"\t\r\n", TEXT, b"\n", COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.non_json == 0
    assert driver.counters.lines == 2


def test_non_json_lines_counted_and_skipped() -> None:
    driver = _driver()
    events = _run(driver, [b"Welcome to the harness v1.0\n", b"{not json\n", TEXT, COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.non_json == 2
    assert driver.counters.messages == 2


def test_json_non_objects_counted_and_skipped() -> None:
    driver = _driver()
    events = _run(driver, [b"[1, 2]\n", b'"text"\n', b"42\n", b"null\n", TEXT, COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.non_json == 4


def test_crlf_line_endings_tolerated() -> None:
    driver = _driver()
    stream = TEXT.replace(b"\n", b"\r\n") + COMPLETE.replace(b"\n", b"\r\n")
    events = _run(driver, [stream])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.non_json == 0


def test_invalid_utf8_replaced_not_fatal() -> None:
    driver = _driver()
    events = _run(driver, [b'{"type":"text","text":"bad \xff\xfe end"}\n', COMPLETE])
    assert isinstance(events[1], AssistantText)
    assert events[1].text == "bad \ufffd\ufffd end"
    assert isinstance(events[-1], TurnComplete)


def test_nesting_too_deep_counted_as_non_json_when_line_nests_200000_levels() -> None:
    driver = _driver()
    events = _run(driver, [b"[" * 200_000 + b"\n", b'{"a":' * 100_000 + b"\n", TEXT, COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.non_json == 2


def test_lenient_json_kept_when_fast_parser_refuses_it() -> None:
    # NaN and an escaped lone surrogate: refused by orjson, valid to Python's json, so they
    # keep meaning what they meant before the fast parser.
    driver = _driver(FakeAdapter())
    lines = [
        b'{"say":"nan","n":NaN}\n',
        b'{"say":"lone \\ud800 surrogate"}\n',
        b'{"done":"ok"}\n',
    ]
    events = _run(driver, lines)
    assert [e.text for e in events if isinstance(e, AssistantText)] == [
        "nan",
        "lone \ud800 surrogate",
    ]
    assert driver.counters.non_json == 0
    seen = driver.state.seen
    assert seen[0]["n"] != seen[0]["n"]  # NaN


def test_oversized_line_dropped_and_counted_when_over_max_line_bytes() -> None:
    driver = _driver(max_line_bytes=64)
    big = _line({"type": "text", "text": "x" * 200})
    events = _run(driver, [TEXT, big[:100], big[100:], COMPLETE])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.oversized == 1


def test_last_line_without_newline_mapped_at_finish() -> None:
    driver = _driver()
    events = _run(driver, [TEXT, COMPLETE.rstrip(b"\n")])
    assert isinstance(events[-1], TurnComplete)
    assert events[-1].text == "done"


def test_lines_after_terminal_dropped_and_counted() -> None:
    driver = _driver()
    events = _run(driver, [COMPLETE, TEXT, b"not json\n", TEXT.rstrip(b"\n")])
    assert [e.type for e in events] == ["turn-started", "turn-complete"]
    assert driver.counters.dropped_after_terminal == 3


def test_second_terminal_line_dropped_when_harness_sends_two() -> None:
    driver = _driver()
    second = _line({"type": "error", "message": "late"})
    events = _run(driver, [COMPLETE + second + _line({"type": "complete", "text": "again"})])
    _assert_turn_shape(events)
    assert isinstance(events[-1], TurnComplete) and events[-1].text == "done"
    assert driver.counters.dropped_after_terminal == 2


def test_second_terminal_in_one_mapping_dropped() -> None:
    driver = _driver(FakeAdapter())
    events = _run(driver, [_line({"many": [{"done": "a"}, {"error": "b"}, {"say": "c"}]})])
    assert [e.type for e in events] == ["turn-started", "turn-complete"]
    assert driver.counters.dropped_after_terminal == 2


def test_exit_error_when_stream_ends_without_terminal() -> None:
    driver = _driver()
    driver.feed(TEXT)
    tail = "warming up\nTraceback: something broke\n"
    events = driver.finish(ExitInfo(3, tail))
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert terminal.reason == "exit"
    assert terminal.retryable is True
    assert terminal.exit_code == 3
    assert terminal.stderr_tail == tail
    assert "something broke" in terminal.error
    assert "code 3" in terminal.error
    assert driver.terminal is terminal


def test_exit_error_when_exit_code_zero_and_no_terminal() -> None:
    events = _run(_driver(), [TEXT], exit_code=0)
    assert isinstance(events[-1], SessionError)
    assert events[-1].reason == "exit"
    assert events[-1].exit_code == 0


def test_exit_error_keeps_only_stderr_tail_when_stderr_long() -> None:
    driver = _driver()
    tail = "a" * 5000 + "\nthe last line"
    events = driver.finish(ExitInfo(None, tail))
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert terminal.stderr_tail == tail[-STDERR_TAIL_CHARS:]
    assert terminal.exit_code is None
    assert "unknown" in terminal.error


def test_mapper_error_counted_and_turn_goes_on() -> None:
    driver = _driver(FakeAdapter())
    events = _run(driver, [_line({"boom": 1}), _line({"say": "a"}), _line({"done": "ok"})])
    assert [e.type for e in events] == ["turn-started", "assistant-text", "turn-complete"]
    assert driver.counters.mapper_errors == 1
    assert driver.last_mapper_error is not None
    assert "KeyError" in driver.last_mapper_error


def test_finish_events_used_when_adapter_supplies_terminal() -> None:
    adapter = FakeAdapter(finish_events=[TurnComplete(text="from finish")])
    events = _run(_driver(adapter), [_line({"say": "a"})])
    assert isinstance(events[-1], TurnComplete)
    assert events[-1].text == "from finish"
    _assert_turn_shape(events)


def test_finish_not_called_when_terminal_already_seen() -> None:
    adapter = FakeAdapter(finish_events=[TurnComplete(text="never")])
    events = _run(_driver(adapter), [_line({"done": "stream"})])
    assert adapter.finish_calls == 0
    assert isinstance(events[-1], TurnComplete) and events[-1].text == "stream"


def test_exit_error_when_finish_returns_no_terminal() -> None:
    adapter = FakeAdapter(finish_events=[AssistantText(text="tail")])
    events = _run(_driver(adapter), [], exit_code=1)
    assert [e.type for e in events] == ["turn-started", "assistant-text", "session-error"]
    assert isinstance(events[-1], SessionError) and events[-1].reason == "exit"


def test_exit_error_when_adapter_finish_raises() -> None:
    driver = _driver(FakeAdapter(finish_raises=True))
    events = _run(driver, [_line({"say": "a"})], exit_code=2)
    _assert_turn_shape(events)
    assert isinstance(events[-1], SessionError)
    assert events[-1].reason == "exit"
    assert events[-1].exit_code == 2
    assert driver.counters.mapper_errors == 1


def test_fail_ends_turn_when_no_terminal_yet() -> None:
    driver = _driver()
    events = driver.feed(TEXT)
    events += driver.fail(session_error("timed out", "timeout"))
    _assert_turn_shape(events)
    assert isinstance(events[-1], SessionError) and events[-1].reason == "timeout"


def test_fail_emits_turn_started_when_called_first() -> None:
    events = _driver().fail(session_error("cancelled", "cancelled"))
    assert [e.type for e in events] == ["turn-started", "session-error"]


def test_fail_adds_nothing_after_terminal() -> None:
    driver = _driver()
    events = _run(driver, [TEXT, COMPLETE])
    assert driver.fail(session_error("late", "timeout")) == []
    assert driver.finish(ExitInfo(0, "")) == []
    assert isinstance(driver.terminal, TurnComplete)
    _assert_turn_shape(events)


def test_finish_adds_nothing_after_fail() -> None:
    driver = _driver()
    events = driver.fail(session_error("cancelled", "cancelled"))
    events += driver.finish(ExitInfo(0, ""))
    _assert_turn_shape(events)
    assert isinstance(events[-1], SessionError) and events[-1].reason == "cancelled"


def test_counters_count_events_emitted() -> None:
    driver = _driver()
    _run(driver, [TEXT, TEXT, COMPLETE])
    assert driver.counters.events == 3
    assert driver.counters.as_dict()["messages"] == 3


MESSAGES = [
    TEXT,
    b"banner\n",
    b"\n",
    b"[1]\n",
    _line({"type": "activity", "kind": "file", "description": "wrote a.txt"}),
    _line({"type": "usage", "input_tokens": 3, "output_tokens": 4}),
    _line({"type": "unknown"}),
    b'{"type":"text","text":"\xff"}\r\n',
    COMPLETE,
    TEXT,
]


@settings(max_examples=100, deadline=None)
@given(
    lines=st.lists(st.sampled_from(MESSAGES), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_any_chunking_yields_same_events_and_one_terminal_last(
    lines: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(lines)
    whole = _run(_driver(), [stream], exit_code=0)
    points = sorted(c for c in cuts if c <= len(stream))
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    chunked = _run(_driver(), chunks, exit_code=0)
    assert chunked == whole
    _assert_turn_shape(chunked)
