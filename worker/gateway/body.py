"""A response body's framing undone as its bytes arrive (RFC 9112 section 6): chunked, of a
known length, or until the connection closes. Pure: bytes in, the body's bytes out.

Each :meth:`Body.feed` takes what one read brought and returns, in one piece, the body's bytes
it completed (a read carrying many chunks of a stream gives one piece, not one per chunk).
:attr:`Body.done` says the body ended; :attr:`Body.extra` holds what came after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_LINE_BYTES = 4096
"""A chunk's size line (with its extensions) or a trailer line longer than this is refused."""
MAX_TRAILER_BYTES = 64 * 1024

_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")


class BadBody(Exception):
    """The body's framing is broken (the upstream's fault)."""


class Body:
    """A body read until the connection closes (no length, not chunked)."""

    done = False
    extra = b""
    until_close = True

    def feed(self, data: bytes) -> bytes:
        return data

    def end(self) -> None:
        """The connection closed: the body ends here (or is cut short: :class:`BadBody`)."""
        self.done = True


class LengthBody(Body):
    until_close = False

    def __init__(self, length: int) -> None:
        self.left = length
        self.done = length == 0

    def feed(self, data: bytes) -> bytes:
        left = self.left
        if len(data) < left:
            self.left = left - len(data)
            return data
        self.left, self.done, self.extra = 0, True, data[left:]
        return data[:left] if self.extra else data

    def end(self) -> None:
        if not self.done:
            raise BadBody(f"the connection closed {self.left} bytes before the body's end")


class ChunkedBody(Body):
    until_close = False

    def __init__(self) -> None:
        self._left = 0
        """Bytes of the current chunk's data still to come."""
        self._state = "size"  # size, data, crlf, trailer
        self._line = b""
        """An unfinished size or trailer line (or the CRLF after a chunk's data)."""
        self._trailer = 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.extra += data
            return b""
        out: list[bytes] = []
        at, end = 0, len(data)
        while at < end and not self.done:
            state = self._state
            if state == "data":
                take = min(self._left, end - at)
                out.append(data[at : at + take] if take < end or at else data)
                at += take
                self._left -= take
                if not self._left:
                    self._state = "crlf"
            elif state == "crlf":
                piece = data[at : at + 2 - len(self._line)]
                self._line += piece
                at += len(piece)
                if len(self._line) == 2:
                    if self._line != b"\r\n":
                        raise BadBody("a chunk's data is not followed by CRLF")
                    self._line, self._state = b"", "size"
            else:
                at = self._feed_line(data, at, end)
        if self.done and at < end:
            self.extra = data[at:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _feed_line(self, data: bytes, at: int, end: int) -> int:
        """A size or trailer line, or its part in ``data[at:]``; where it leaves off."""
        stop = data.find(b"\n", at, end)
        if stop < 0:
            self._line += data[at:end]
            if len(self._line) > MAX_LINE_BYTES:
                raise BadBody("a chunk size or trailer line is too long")
            return end
        line = self._line + data[at:stop] if self._line else data[at:stop]
        self._line = b""
        if len(line) > MAX_LINE_BYTES:
            raise BadBody("a chunk size or trailer line is too long")
        if not line.endswith(b"\r"):
            raise BadBody("a chunk size or trailer line does not end with CRLF")
        line = line[:-1]
        if self._state == "size":
            found = _SIZE.fullmatch(line)
            if found is None:
                raise BadBody(f"a chunk size line is not one: {line[:40]!r}")
            self._left = int(found.group(1), 16)
            self._state = "data" if self._left else "trailer"
        elif line:
            self._trailer += len(line)
            if self._trailer > MAX_TRAILER_BYTES:
                raise BadBody("the chunked body's trailer is too long")
        else:
            self.done = True
        return stop + 1

    def end(self) -> None:
        if not self.done:
            raise BadBody("the connection closed before the chunked body's end")


def body_for(method: bytes, status: int, headers: Iterable[tuple[bytes, bytes]]) -> Body:
    """How the body of a response with these (h11-validated, lower-case) headers is framed,
    answering ``method`` (RFC 9112 section 6.3)."""
    if method == b"HEAD" or status in (204, 304) or status < 200:
        return LengthBody(0)
    length: int | None = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return ChunkedBody()  # h11 lets no other coding through
        if name == b"content-length":
            length = int(value)
    return Body() if length is None else LengthBody(length)
