"""The byte level of a Docker exec: the upgraded connection and the multiplexed stream on it.

``exec start`` without a TTY answers ``101 UPGRADED`` and then carries, on the same
connection, the exec's stdin (client to daemon) and its stdout and stderr (daemon to client)
in frames: an 8-byte header (stream type, three zero bytes, big-endian payload length) and the
payload. Half-closing the write side tells the daemon that stdin ended, so the harness reads
EOF while its output keeps flowing.

For ``unix://`` and plain ``tcp://`` daemons we speak that one HTTP request ourselves, so the
bytes that arrive right behind the response headers are ours to keep: the Docker SDK's
``exec_start(socket=True)`` parses the headers through a buffered reader and then hands out
the raw socket, which can lose a first frame that came in the same packet as the headers.
Other transports (TLS, SSH) go through the SDK and accept that small risk.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

STDOUT = 1
STDERR = 2
SYSTEM_ERROR = 3
_HEADER = 8
_RECV = 256 * 1024
_MAX_RESPONSE_HEAD = 64 * 1024


class DaemonRefused(Exception):
    """The daemon answered a request we spoke ourselves (an exec's start here, its create and
    inspect in :mod:`sandbox.docker.raw_api`) with an error status: ``status``, and its own
    ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RawEndpoint:
    """Where to open our own connection to the daemon: a unix socket path or host and port."""

    unix_path: str | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> RawEndpoint | None:
        """The endpoint for a ``unix://`` or ``tcp://``/``http://`` URL; None for TLS and SSH."""
        parsed = urlparse(url)
        if parsed.scheme in ("unix", "http+unix"):
            return cls(unix_path=parsed.path or "/var/run/docker.sock")
        if parsed.scheme in ("tcp", "http") and parsed.hostname:
            return cls(host=parsed.hostname, port=parsed.port or 2375)
        return None

    def connect(self, timeout: float) -> socket.socket:
        if self.unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.unix_path)
            except OSError:
                sock.close()
                raise
            return sock
        assert self.host is not None and self.port is not None
        return socket.create_connection((self.host, self.port), timeout=timeout)


def open_exec_stream(
    endpoint: RawEndpoint, api_version: str, exec_id: str, timeout: float
) -> tuple[socket.socket, bytes]:
    """Start exec ``exec_id`` attached; return the upgraded socket (blocking, no timeout) and
    the stream bytes that arrived with the response headers.

    Raises :class:`DaemonRefused` when the daemon answers with an error status, and
    ``OSError`` when it cannot be reached: neither leaves the Docker backend, whose exec seam
    (:mod:`sandbox.docker.execs`) translates both into the :class:`~sandbox.base.SandboxError`
    tree.
    """
    body = b'{"Detach":false,"Tty":false}'
    request = (
        f"POST /v{api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
        "Host: docker\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: Upgrade\r\n"
        "Upgrade: tcp\r\n"
        "\r\n"
    ).encode() + body
    sock = endpoint.connect(timeout)
    try:
        sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            data = sock.recv(_RECV)
            if not data:
                raise ConnectionError("the Docker daemon closed the connection during exec start")
            buffer += data
            if len(buffer) > _MAX_RESPONSE_HEAD:
                raise ConnectionError("the Docker daemon sent an oversized response head")
        head, rest = buffer.split(b"\r\n\r\n", 1)
        status = _status(head)
        if status in (101, 200):
            sock.settimeout(None)  # a quiet turn may send nothing for a long time
            return sock, rest
        raise DaemonRefused(status, _error_message(sock, head, rest))
    except BaseException:
        sock.close()
        raise


def _status(head: bytes) -> int:
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        raise ConnectionError(f"unexpected answer from the Docker daemon: {parts!r}") from None


def _error_message(sock: socket.socket, head: bytes, rest: bytes) -> str:
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                length = None
    body = rest
    try:
        while length is not None and len(body) < length:
            data = sock.recv(_RECV)
            if not data:
                break
            body += data
    except OSError:
        pass
    try:
        decoded: Any = json.loads(body)
        if isinstance(decoded, dict) and "message" in decoded:
            return str(decoded["message"])
    except ValueError:
        pass
    return body.decode("utf-8", "replace").strip() or "no message"


def frames(sock: socket.socket, initial: bytes = b"") -> Iterator[tuple[int, bytes]]:
    """Yield ``(stream type, payload)`` until the daemon closes the stream.

    A truncated last frame (the connection dropped mid-frame) ends the iteration; its partial
    payload is yielded first so no output the harness wrote is lost.
    """
    buffer = bytearray(initial)
    while True:
        while len(buffer) < _HEADER:
            data = sock.recv(_RECV)
            if not data:
                return
            buffer += data
        kind = buffer[0]
        size = int.from_bytes(buffer[4:8], "big")
        while len(buffer) < _HEADER + size:
            data = sock.recv(max(_RECV, _HEADER + size - len(buffer)))
            if not data:
                if len(buffer) > _HEADER:
                    yield kind, bytes(buffer[_HEADER:])
                return
            buffer += data
        payload = bytes(buffer[_HEADER : _HEADER + size])
        del buffer[: _HEADER + size]
        if payload:
            yield kind, payload
