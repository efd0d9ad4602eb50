"""A response body's framing undone (worker/gateway/body.py), whatever the reads' sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.gateway.body import (
    MAX_LINE_BYTES,
    BadBody,
    Body,
    ChunkedBody,
    LengthBody,
    body_for,
)


def chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n" + trailer + b"\r\n"


def feed_all(body: Body, wire: bytes, cuts: list[int]) -> tuple[list[bytes], bytes]:
    """``wire`` fed in pieces cut at ``cuts``: what each feed gave, and what came after."""
    pieces, start = [], 0
    for cut in [*sorted(set(cuts)), len(wire)]:
        if cut > start:
            pieces.append(body.feed(wire[start:cut]))
            start = cut
    return pieces, body.extra


PAYLOAD = (b"data: one\n\n", b"d", b"ata: two\n\n", b"x" * 5000)
WIRE = chunked(*PAYLOAD, trailer=b"x-sum: 1\r\nx-more: 2\r\n") + b"NEXT"


@given(st.lists(st.integers(min_value=0, max_value=len(WIRE)), max_size=30))
def test_a_chunked_body_comes_out_whole_however_it_is_cut(cuts: list[int]) -> None:
    body = ChunkedBody()
    pieces, extra = feed_all(body, WIRE, cuts)
    assert body.done and b"".join(pieces) == b"".join(PAYLOAD) and extra == b"NEXT"


def test_every_single_cut_of_a_chunked_body() -> None:
    for cut in range(len(WIRE) + 1):
        body = ChunkedBody()
        pieces, extra = feed_all(body, WIRE, [cut])
        assert b"".join(pieces) == b"".join(PAYLOAD) and extra == b"NEXT", cut


def test_a_read_of_many_chunks_gives_one_piece() -> None:
    frames = [b"data: %d\n\n" % i for i in range(50)]
    body = ChunkedBody()
    assert body.feed(chunked(*frames)[:-5]) == b"".join(frames)


def test_extensions_and_spaces_after_the_size_are_taken() -> None:
    body = ChunkedBody()
    assert body.feed(b"5;name=value\r\nhello\r\n3 \r\nabc\r\n0\r\n\r\n") == b"helloabc"
    assert body.done


@pytest.mark.parametrize(
    "wire",
    [
        b"5\r\nhelloXX0\r\n\r\n",  # no CRLF after the data
        b"zz\r\nhello\r\n",  # not a size
        b"0x5\r\nhello\r\n",
        b"-5\r\nhello\r\n",
        b"5\nhello\r\n",  # a bare LF
        b"1" * (MAX_LINE_BYTES + 2),  # a size line that never ends
    ],
)
def test_broken_framing_is_refused(wire: bytes) -> None:
    with pytest.raises(BadBody):
        ChunkedBody().feed(wire)


def test_a_chunked_body_cut_short_is_not_an_end() -> None:
    body = ChunkedBody()
    assert body.feed(b"5\r\nhel") == b"hel"
    with pytest.raises(BadBody):
        body.end()


def test_a_body_of_known_length_and_what_follows_it() -> None:
    body = LengthBody(10)
    assert body.feed(b"01234") == b"01234" and not body.done
    assert body.feed(b"56789after") == b"56789" and body.done and body.extra == b"after"
    short = LengthBody(10)
    short.feed(b"0123")
    with pytest.raises(BadBody):
        short.end()
    assert LengthBody(0).done


def test_a_body_until_the_close() -> None:
    body = Body()
    assert body.feed(b"anything") == b"anything" and not body.done
    body.end()
    assert body.done and body.until_close


@pytest.mark.parametrize(
    ("method", "status", "headers", "kind", "done"),
    [
        (b"POST", 200, [(b"transfer-encoding", b"chunked")], ChunkedBody, False),
        (b"POST", 200, [(b"content-length", b"5")], LengthBody, False),
        (b"POST", 200, [(b"content-length", b"0")], LengthBody, True),
        (b"POST", 200, [], Body, False),
        (b"HEAD", 200, [(b"content-length", b"5")], LengthBody, True),
        (b"POST", 204, [], LengthBody, True),
        (b"GET", 304, [(b"content-length", b"5")], LengthBody, True),
    ],
)
def test_the_framing_a_response_says(
    method: bytes, status: int, headers: list[tuple[bytes, bytes]], kind: type, done: bool
) -> None:
    body = body_for(method, status, headers)
    assert type(body) is kind and body.done is done
