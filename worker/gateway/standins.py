"""Stand-in credentials: what a harness holds instead of a model key.

Each granted model key of a turn gets a fresh random stand-in (``hwgw_`` and 40 hex
characters) under the same variable name. The gateway of that turn alone knows which real
value it stands for: anywhere else, and at this gateway once the turn is over, it is worth
nothing. On a request, every place a vendor puts a key (``x-api-key``, ``Authorization:
Bearer``, ``x-goog-api-key``, ``api-key``, a ``key=`` query parameter, or any other header)
is searched for stand-ins and each is replaced by its real value; a request that carries no
stand-in of the turn, or one of another turn, is refused.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

PREFIX = "hwgw_"
_PATTERN = re.compile(PREFIX + r"[0-9a-f]{40}")
_PATTERN_BYTES = re.compile(PREFIX.encode() + rb"[0-9a-f]{40}")


def new_standin() -> str:
    return PREFIX + secrets.token_hex(20)


@dataclass(frozen=True)
class StandIns:
    """One turn's stand-ins: variable name → stand-in, and stand-in → real value."""

    by_name: Mapping[str, str] = field(default_factory=dict)
    _real: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def issue(cls, real: Mapping[str, str]) -> StandIns:
        """Stand-ins for ``real`` (variable name → the real key)."""
        by_name = {name: new_standin() for name in real}
        return cls(by_name, {by_name[name]: value for name, value in real.items()})

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def swap_header(self, value: bytes) -> tuple[bytes, int, int]:
        """``value`` with this turn's stand-ins replaced: (value, swapped, foreign)."""
        if PREFIX.encode() not in value:
            return value, 0, 0
        swapped = foreign = 0

        def real(match: re.Match[bytes]) -> bytes:
            nonlocal swapped, foreign
            found = self._real.get(match.group().decode())
            if found is None:
                foreign += 1
                return match.group()
            swapped += 1
            return found.encode()

        return _PATTERN_BYTES.sub(real, value), swapped, foreign

    @property
    def real_values(self) -> tuple[str, ...]:
        """The real values these stand in for (the gateway masks them in what comes back)."""
        return tuple(self._real.values())

    def swap_query(self, query: str) -> tuple[str, int, int]:
        """A query string with stand-ins replaced (URL-quoted): (query, swapped, foreign)."""
        if PREFIX not in query:
            return query, 0, 0
        swapped = foreign = 0

        def real(match: re.Match[str]) -> str:
            nonlocal swapped, foreign
            found = self._real.get(match.group())
            if found is None:
                foreign += 1
                return match.group()
            swapped += 1
            return quote(found, safe="")

        return _PATTERN.sub(real, query), swapped, foreign
