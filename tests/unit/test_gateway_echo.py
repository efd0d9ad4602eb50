"""The model gateway's echo mask: a real key in what an upstream sends back is masked
wherever the chunks split it, and the body keeps its length."""

from __future__ import annotations

import pytest

from worker.gateway.echo import EchoMask

KEY = "sk-ant-real-0123456789abcdef"


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(KEY) - 1, len(KEY), 64])
def test_a_key_split_anywhere_is_masked_and_the_length_kept(size: int) -> None:
    body = f'{{"error": "bad key {KEY}", "again": "{KEY}"}}'.encode()
    mask = EchoMask([KEY, "short"])
    out = b"".join(mask.feed(body[i : i + size]) for i in range(0, len(body), size))
    out += mask.flush()
    assert KEY.encode() not in out and len(out) == len(body)
    assert out.count(b"*" * len(KEY)) == 2
    assert b"short" not in body or b"short" in out  # too short to be searched for


def test_headers_and_nothing_to_mask() -> None:
    assert EchoMask([KEY]).header(f"Bearer {KEY}".encode()) == b"Bearer " + b"*" * len(KEY)
    idle = EchoMask([])
    assert not idle and idle.feed(b"abc") == b"abc" and idle.flush() == b""
