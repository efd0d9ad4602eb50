"""Lines parsed a block at a time (``StreamDriver._block``): the same events and counters as
line by line, whatever the output and however it is chunked, with one JSON parse per block
where every line is one document."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import stdio_json
from adapters.events import Event
from adapters.protocol import ExitInfo, TurnRequest
from adapters.stream import BLOCK_PAUSE, LineSplitter, StreamDriver

EXIT = ExitInfo(exit_code=0, stderr_tail="")


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _text(value: str) -> bytes:
    return _line({"type": "text", "text": value})


def _driver(bound: int = 0) -> StreamDriver:
    return StreamDriver(stdio_json, TurnRequest(input="hi", executable="x"), coalesce_chars=bound)


def _run(lines: list[bytes], chunks: list[bytes] | None, bound: int) -> tuple[Any, ...]:
    """Every event and the counters of a turn fed ``chunks`` (or one line per feed). Held
    text is released only by the next event of another kind and at the end, so where text
    merges does not depend on the chunking (the worker also releases it after each read)."""
    driver = _driver(bound)
    events: list[Event] = []
    for chunk in chunks if chunks is not None else [line + b"\n" for line in lines]:
        events += driver.feed(chunk)
    events += driver.finish(EXIT)
    return [e.model_dump() for e in events], driver.counters.as_dict(), driver.last_mapper_error


LINES = st.one_of(
    st.text(max_size=40).map(_text),
    st.sampled_from(
        [
            _line({"type": "activity", "kind": "command", "description": "ls"}),
            _line({"type": "usage", "input_tokens": 3, "output_tokens": 4}),
            _line({"type": "session", "id": "s1"}),
            _line({"type": "text", "text": 7}),  # a text message without text
            _line({"type": "text"}),
            _line({"type": "complete", "text": "done"}),  # the terminal: what follows is dropped
            _line({"type": "usage", "input_tokens": "x"}),
            b"",  # blank
            b"  \t",
            b"\x0c",  # space to Python, not to JSON
            b"a banner, not JSON",
            b"[1, 2, 3]",
            b"42",
            b'"a string"',
            b"NaN",  # json reads it, orjson does not
            b'{"type":"text","text":"bad \xff bytes"}',  # invalid UTF-8, replaced
            b'{"type":"text","text":"\\ud800"}',  # a lone surrogate
            b'{"type":"text","text":"two"},{"type":"text","text":"docs"}',
            b'{"type":"text","text":"a"} {"type":"text","text":"b"}',
            b'{"type":"text",',  # a document over two lines ...
            b'"text":"split"}',
            b'{"n": 18446744073709551616}',  # past 64 bits
            b"[" * 2000 + b"]" * 2000,  # deeper than either parser goes
        ]
    ),
).map(lambda line: line + b"\r" if line.endswith(b"}") and len(line) % 5 == 0 else line)


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(min(c, len(data)) for c in cuts)
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(LINES, max_size=40),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=6),
    st.sampled_from([0, 1, 8, 40, 200]),
    st.booleans(),
)
def test_any_output_any_chunking_gives_what_line_by_line_gives(
    lines: list[bytes], cuts: list[int], bound: int, ends_with_newline: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if ends_with_newline else b"")
    one_at_a_time = [line + b"\n" for line in lines]
    if lines and not ends_with_newline:
        one_at_a_time[-1] = lines[-1]
    assert _run(lines, _chunked(data, cuts), bound) == _run(lines, one_at_a_time, bound)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(max_size=60), min_size=1, max_size=80),
    st.integers(min_value=1, max_value=300),
    st.lists(st.integers(min_value=0, max_value=8000), max_size=4),
)
def test_a_text_flood_merges_at_the_same_places_as_line_by_line(
    texts: list[str], bound: int, cuts: list[int]
) -> None:
    lines = [_text(t) for t in texts]
    data = b"".join(line + b"\n" for line in lines)
    assert _run(lines, _chunked(data, cuts), bound) == _run(lines, None, bound)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What orjson is asked to parse, each call's input."""
    seen: list[bytes] = []
    loads = orjson.loads

    def counting(data: bytes) -> Any:
        seen.append(bytes(data))
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    return seen


def test_a_flood_is_parsed_once_per_block_not_once_per_line(parses: list[bytes]) -> None:
    driver = _driver(bound=1 << 20)
    driver.feed(b"".join(_text(f"line {i}") + b"\n" for i in range(32)))
    assert len(parses) == 1
    assert [e.model_dump() for e in driver.release_text()] == [
        {"type": "assistant-text", "text": "".join(f"line {i}" for i in range(32))}
    ]
    assert driver.counters.lines == driver.counters.messages == 32


def test_a_line_holding_two_documents_is_not_json_in_a_block_either(
    parses: list[bytes],
) -> None:
    driver = _driver()
    events = driver.feed(
        _text("one") + b"," + _text("two") + b"\n" + _text("three") + b"\n" + _text("four") + b"\n"
    )
    # Three lines parsed as an array of four documents: not one per line, so line by line.
    assert [e.model_dump().get("text") for e in events[1:]] == ["three", "four"]
    assert driver.counters.non_json == 1
    assert len(parses) == 1 + 3


def test_after_a_block_that_does_not_parse_whole_the_next_chunks_go_line_by_line(
    parses: list[bytes],
) -> None:
    """A harness that writes blank lines between its messages does not pay for a failed
    block parse on every chunk."""
    driver = _driver()
    chunk = b"".join(_text(str(i)) + b"\n\n" for i in range(4))
    for _ in range(BLOCK_PAUSE + 1):
        driver.feed(chunk)
    assert len(parses) == 1 + 4 * (BLOCK_PAUSE + 1)
    driver.feed(chunk)  # the pause is over: the block is tried again
    assert len(parses) == 1 + 4 * (BLOCK_PAUSE + 1) + 1 + 4
    assert driver.counters.messages == 4 * (BLOCK_PAUSE + 2)


def test_whole_lines_takes_two_or_more_complete_lines_and_holds_the_rest() -> None:
    splitter = LineSplitter(max_line_bytes=100)
    assert splitter.whole_lines(b'{"a":1}\n') is None  # one line: feed takes it
    assert splitter.whole_lines(b"no newline") is None
    assert splitter.feed(b'{"b"') == []
    assert splitter.whole_lines(b':2}\n{"c":3}\n{"d"') == b'{"b":2}\n{"c":3}'
    assert splitter.flush() == [b'{"d"']


def test_whole_lines_leaves_a_chunk_that_could_hold_an_oversized_line_to_feed() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    assert splitter.whole_lines(b"a\n" + b"x" * 20 + b"\n") is None
    assert splitter.feed(b"a\n" + b"x" * 20 + b"\n") == [b"a"]
    assert splitter.oversized == 1
