"""Bytes through Redis in bounded chunks: a producer's archive up, a diff or an export down.

Both directions use a Redis list of binary chunks on a client without response decoding.

- Up (:func:`upload`, :func:`receive_upload`): the producer pushes the whole archive (it is
  bounded by ``HARNESS_ARCHIVE_MAX_BYTES``) before the run's first turn is sent; the worker
  reads it chunk by chunk into a file, checks its size and SHA-256, and deletes it.
- Down (:class:`ReplyWriter`, :func:`read_reply`): the worker pushes tagged chunks while the
  producer pops them; the worker waits while ``WINDOW`` chunks are unread, so a reply of any
  size holds at most ``WINDOW * CHUNK_BYTES`` in Redis, and gives up on a reader that has
  gone away. The last chunk says how the reply ended: ``E`` + JSON (done, with its facts) or
  ``X`` + a sentence (refused or failed).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

import redis

from worker.errors import InvalidInput, Refused, Unavailable

CHUNK_BYTES = 1024 * 1024
WINDOW = 8
"""Reply chunks that may sit unread in Redis before the writer waits for the reader."""
REPLY_TTL_S = 300
READER_GONE_S = 60.0
"""A reply whose reader took nothing for this long is abandoned (and deleted)."""

_DATA, _END, _FAIL = b"D", b"E", b"X"


class BinaryRedis(Protocol):
    """The commands of a ``redis.Redis`` without ``decode_responses`` that we call."""

    def rpush(self, name: str, *values: bytes) -> int: ...

    def lindex(self, name: str, index: int) -> bytes | None: ...

    def llen(self, name: str) -> int: ...

    def blpop(self, keys: list[str], timeout: float) -> tuple[bytes, bytes] | None: ...

    def expire(self, name: str, time: int) -> bool: ...

    def delete(self, *names: str) -> int: ...

    def close(self) -> None: ...


class ReaderGone(Exception):
    """The producer stopped reading the reply (the writer stops and cleans up)."""


def binary_client(redis_url: str) -> BinaryRedis:
    return cast(
        BinaryRedis,
        redis.Redis.from_url(
            redis_url,
            decode_responses=False,
            socket_connect_timeout=5,
            socket_timeout=60,
        ),
    )


def upload(
    client: BinaryRedis, key: str, path: Path, max_bytes: int, ttl_s: int
) -> tuple[str, int]:
    """Push the file at ``path`` to ``key`` in chunks; returns its SHA-256 and size.

    Refused with InvalidInput when it is not a regular file (a folder, a device such as
    ``/dev/zero``, a pipe) or larger than ``max_bytes``: before anything is pushed when its
    size says so, and as soon as it grows past the limit while being read (nothing is left
    pushed then).
    """
    try:
        # O_NONBLOCK: a pipe opens without waiting for a writer, and is then refused.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(f"cannot read the archive {str(path)!r}: {exc.strerror}") from None
    facts = os.fstat(fd)
    if not stat.S_ISREG(facts.st_mode):
        os.close(fd)
        raise InvalidInput(
            f"cannot read the archive {str(path)!r}: not a file (give a .tar, .tar.gz or .zip)"
        )
    with os.fdopen(fd, "rb") as source:
        if facts.st_size > max_bytes:
            raise _too_big(facts.st_size, max_bytes)
        digest, size = hashlib.sha256(), 0
        client.delete(key)
        while chunk := source.read(CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                client.delete(key)
                raise _too_big(size, max_bytes)
            digest.update(chunk)
            client.rpush(key, chunk)
            client.expire(key, ttl_s)
    return digest.hexdigest(), size


def _too_big(size: int, max_bytes: int) -> InvalidInput:
    return InvalidInput(
        f"the archive is {size} bytes or more, over the operator's limit of {max_bytes} "
        "(HARNESS_ARCHIVE_MAX_BYTES)"
    )


def push_bytes(client: BinaryRedis, key: str, data: bytes, ttl_s: int) -> None:
    """Push ``data`` (already read and bounded by the caller: an attachment) to ``key``."""
    client.delete(key)
    for start in range(0, len(data), CHUNK_BYTES):
        client.rpush(key, data[start : start + CHUNK_BYTES])
        client.expire(key, ttl_s)


def read_bytes(client: BinaryRedis, key: str, sha256: str, max_bytes: int) -> bytes:
    """The bytes pushed to ``key`` (:func:`push_bytes`), then deleted. InvalidInput when they
    are gone, larger than ``max_bytes`` or not the SHA-256 the message named."""
    buffer = io.BytesIO()
    try:
        receive_upload(client, key, buffer, sha256, max_bytes, what="attachment")
    finally:
        client.delete(key)
    return buffer.getvalue()


def receive_upload(
    client: BinaryRedis,
    key: str,
    destination: BinaryIO,
    sha256: str,
    max_bytes: int,
    *,
    what: str = "archive",
) -> int:
    """Write the uploaded chunks at ``key`` to ``destination``; returns the size.

    InvalidInput when the upload is missing, larger than ``max_bytes`` or not the archive
    whose SHA-256 the run was given.
    """
    digest, size, index = hashlib.sha256(), 0, 0
    while True:
        chunk = client.lindex(key, index)
        if chunk is None:
            break
        size += len(chunk)
        if size > max_bytes:
            setting = "ATTACH" if what == "attachment" else "ARCHIVE"
            raise InvalidInput(
                f"the uploaded {what} is over the operator's limit of {max_bytes} bytes "
                f"(HARNESS_{setting}_MAX_BYTES)"
            )
        digest.update(chunk)
        destination.write(chunk)
        index += 1
    if index == 0:
        raise InvalidInput(f"the run's uploaded {what} is gone (expired, or never uploaded)")
    if digest.hexdigest() != sha256:
        raise InvalidInput(f"the uploaded {what} does not match its SHA-256 (incomplete upload?)")
    return size


class ReplyWriter:
    """The worker's side of a reply: a file-like sink for data, then :meth:`end` or :meth:`fail`."""

    def __init__(self, client: BinaryRedis, key: str) -> None:
        self.client, self.key = client, key
        self._pending = bytearray()
        self.sent = 0

    def write(self, data: bytes) -> int:
        self._pending += data
        while len(self._pending) >= CHUNK_BYTES:
            self._push(_DATA + bytes(self._pending[:CHUNK_BYTES]))
            del self._pending[:CHUNK_BYTES]
        return len(data)

    def tell(self) -> int:
        return self.sent + len(self._pending)

    def flush(self) -> None:
        """Nothing to do: chunks leave whole (``tarfile`` and ``gzip`` call it)."""

    def end(self, facts: dict[str, Any]) -> None:
        if self._pending:
            self._push(_DATA + bytes(self._pending))
            self._pending.clear()
        self._push(_END + json.dumps(facts).encode())

    def fail(self, message: str) -> None:
        self._pending.clear()
        self._push(_FAIL + message.encode("utf-8", "replace"))

    def _push(self, chunk: bytes) -> None:
        waited_since = time.monotonic()
        while self.client.llen(self.key) >= WINDOW:
            if time.monotonic() - waited_since > READER_GONE_S:
                self.client.delete(self.key)
                raise ReaderGone(self.key)
            time.sleep(0.02)
        self.client.rpush(self.key, chunk)
        self.client.expire(self.key, REPLY_TTL_S)
        self.sent += len(chunk) - 1


def read_reply(
    client: BinaryRedis,
    key: str,
    on_data: Callable[[bytes], object],
    *,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Pop the reply at ``key``, handing each data chunk to ``on_data``; returns its facts.

    ``timeout_s`` bounds each wait for the next chunk (a large export keeps going as long as
    chunks come). Refused with the host's sentence when it refused; Unavailable when no
    chunk came in time, or ``alive`` says no worker is there to answer.
    """
    try:
        waited = 0.0
        while True:
            item = client.blpop([key], timeout=1)
            if item is None:
                waited += 1
                if alive is not None and waited >= 5 and not alive():
                    raise Unavailable("no live worker on the run's host answered the request")
                if waited >= timeout_s:
                    raise Unavailable(f"the run's host did not answer within {timeout_s:g}s")
                continue
            waited = 0.0
            chunk = item[1]
            tag, body = chunk[:1], chunk[1:]
            if tag == _DATA:
                on_data(body)
            elif tag == _END:
                facts: dict[str, Any] = json.loads(body)
                return facts
            elif tag == _FAIL:
                raise Refused(body.decode("utf-8", "replace"))
            else:
                raise Refused(f"unreadable reply chunk (tag {tag!r})")
    finally:
        client.delete(key)
