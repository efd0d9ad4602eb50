"""LineSplitter: bytes to lines, bounded memory, independent of how the bytes are chunked."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.stream import LineSplitter


def _feed_all(splitter: LineSplitter, chunks: list[bytes]) -> list[bytes]:
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(splitter.feed(chunk))
    lines.extend(splitter.flush())
    return lines


def _reference(data: bytes, max_line_bytes: int) -> tuple[list[bytes], int]:
    """What any chunking must produce: every line (the last may lack its newline) that fits."""
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the stream ended with a newline, or was empty
    kept = [p for p in pieces if len(p) <= max_line_bytes]
    return kept, len(pieces) - len(kept)


def _held(splitter: LineSplitter) -> int:
    """Bytes the splitter is holding (its internal buffer), checked against its own count."""
    held = sum(len(part) for part in splitter._parts)
    assert held == splitter._size
    return held


def _chunkings(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """Any split of ``data`` into consecutive chunks (empty chunks included)."""
    cuts = st.lists(st.integers(min_value=0, max_value=len(data)), max_size=12)
    return cuts.map(
        lambda points: [
            data[a:b]
            for a, b in zip([0, *sorted(points)], [*sorted(points), len(data)], strict=True)
        ]
    )


def test_split_lines_across_chunks_when_newline_arrives_later() -> None:
    splitter = LineSplitter(max_line_bytes=100)
    assert splitter.feed(b'{"a"') == []
    assert splitter.feed(b":1}\n{") == [b'{"a":1}']
    assert splitter.feed(b"}\n\n") == [b"{}", b""]
    assert splitter.flush() == []


def test_flush_returns_last_line_when_stream_lacks_final_newline() -> None:
    splitter = LineSplitter(max_line_bytes=100)
    assert splitter.feed(b"one\ntwo") == [b"one"]
    assert splitter.flush() == [b"two"]
    assert splitter.flush() == []


def test_oversized_line_dropped_and_counted_when_in_one_chunk() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    lines = splitter.feed(b"short\n" + b"x" * 11 + b"\nafter\n")
    assert lines == [b"short", b"after"]
    assert splitter.oversized == 1


def test_oversized_line_dropped_once_when_spread_over_chunks() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    out: list[bytes] = []
    for chunk in [b"ok\nxxxx", b"xxxx", b"xxxx", b"xxxx", b"xx\nnext\n"]:
        out.extend(splitter.feed(chunk))
        assert _held(splitter) <= 10
    assert out == [b"ok", b"next"]
    assert splitter.oversized == 1


def test_oversized_last_line_dropped_when_stream_ends_without_newline() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    assert splitter.feed(b"ok\n" + b"y" * 50) == [b"ok"]
    assert splitter.flush() == []
    assert splitter.oversized == 1


def test_line_of_exactly_max_bytes_kept() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    assert _feed_all(splitter, [b"0123456", b"789\n"]) == [b"0123456789"]
    assert splitter.oversized == 0


def test_splitter_reusable_after_flush_of_discarded_line() -> None:
    splitter = LineSplitter(max_line_bytes=4)
    splitter.feed(b"toolong")
    assert splitter.flush() == []
    assert splitter.feed(b"ok\n") == [b"ok"]


LINE = st.binary(max_size=24).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    lines=st.lists(LINE, max_size=10),
    trailing_newline=st.booleans(),
    max_line_bytes=st.integers(min_value=1, max_value=20),
)
def test_any_chunking_yields_same_lines_when_stream_is_the_same(
    data: st.DataObject, lines: list[bytes], trailing_newline: bool, max_line_bytes: int
) -> None:
    stream = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    expected, dropped = _reference(stream, max_line_bytes)
    chunks = data.draw(_chunkings(stream))
    splitter = LineSplitter(max_line_bytes=max_line_bytes)
    assert _feed_all(splitter, chunks) == expected
    assert splitter.oversized == dropped


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    stream=st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"\n")),
    max_line_bytes=st.integers(min_value=1, max_value=16),
)
def test_splitter_never_holds_more_than_max_line_bytes_for_any_chunking(
    data: st.DataObject, stream: bytes, max_line_bytes: int
) -> None:
    splitter = LineSplitter(max_line_bytes=max_line_bytes)
    for chunk in data.draw(_chunkings(stream)):
        for line in splitter.feed(chunk):
            assert len(line) <= max_line_bytes
        assert _held(splitter) <= max_line_bytes
    for line in splitter.flush():
        assert len(line) <= max_line_bytes
    assert _held(splitter) == 0
