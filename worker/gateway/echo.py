"""What an upstream sends back may carry the real key it was given (an error that quotes the
key, a debugging header, a proxy that echoes the request): the harness must never see it.
:class:`EchoMask` replaces each real value of the turn with as many ``*`` in the response's
headers and in its body as it streams, holding back the few bytes at a chunk's end that could
be the start of a key split across chunks. The length never changes, so a ``Content-Length``
stays true.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_SECRET_BYTES = 8
"""Shorter values are not searched for (they would mask ordinary text)."""


class EchoMask:
    def __init__(self, secrets: Iterable[str]) -> None:
        found = {s.encode("utf-8") for s in secrets if len(s.encode("utf-8")) >= MIN_SECRET_BYTES}
        self._secrets = sorted(found, key=len, reverse=True)
        self._keep = max((len(s) for s in self._secrets), default=1) - 1
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def header(self, value: bytes) -> bytes:
        return self._mask(value)

    def feed(self, chunk: bytes) -> bytes:
        """What of the body so far may go to the harness now (masked)."""
        if not self._secrets:
            return chunk
        data = self._mask(self._held + chunk)
        if len(data) <= self._keep:
            self._held = data
            return b""
        cut = len(data) - self._keep
        self._held = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        """The rest, at the body's end."""
        rest, self._held = self._mask(self._held), b""
        return rest

    def _mask(self, data: bytes) -> bytes:
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, b"*" * len(secret))
        return data
