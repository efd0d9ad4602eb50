"""Regular expressions a producer writes (an output schema's ``pattern`` and
``patternProperties``), run by RE2: linear in the text, whatever the pattern.

Python's ``re`` backtracks: ``^(a+)+$`` against 28 characters takes seconds and holds the GIL
all along, so every other thread of the process (every turn of a worker, every request of
the API) waits. RE2 (``google-re2``) has no backtracking, matches in time linear in the text
and releases the GIL while it matches. What it cannot do in linear time (back-references,
look-around, possessive quantifiers) it refuses to compile: such a pattern is refused when
the schema is given. ``MAX_MEM`` bounds the compiled program, which also bounds how long
one compile holds the GIL (about 10 ms at most).

Only this module imports ``re2``: the schema check, the answer check and the permission
rules call it.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

MAX_MEM = 1 << 20
"""Bytes RE2 may use for one compiled pattern (and its DFA): ``\\pL{1000}`` is over it. A
DFA that outgrows its share makes RE2 fall back to its NFA for later matches of that
compiled pattern: still linear, but slower by the pattern's length (a 490-character glob
against a 4 MiB command: 40 s instead of 10 ms), so a pattern matched again and again
against long text (a ``--deny`` glob) is compiled with more (``max_mem``)."""


class PatternError(ValueError):
    """A pattern RE2 refuses: the message says why."""


@functools.lru_cache(maxsize=4)
def _options(max_mem: int) -> Any:
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # RE2 would print each refused pattern on stderr
    return options


def compile_pattern(pattern: str, *, max_mem: int = MAX_MEM) -> Any:
    """``pattern`` compiled by RE2, or PatternError saying why RE2 refuses it."""
    try:
        return re2.compile(pattern.encode("utf-8"), _options(max_mem))
    except UnicodeEncodeError:
        raise PatternError("it is not valid Unicode text (a lone surrogate)") from None
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "refused"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        if "too large" in reason:
            reason += (
                " (a repetition of a large class, such as \\pL{1000}; maxLength bounds a length)"
            )
        raise PatternError(
            f"RE2, the linear-time engine patterns run on, refuses it: {reason}"
        ) from None


def text_bytes(text: str) -> bytes:
    """``text`` as the UTF-8 RE2 matches: a lone surrogate (JSON's ``"\\ud800"``) becomes
    bytes that are not UTF-8, which no pattern's character matches."""
    return text.encode("utf-8", "surrogatepass")


def searches(compiled: Any, text: str) -> bool:
    """Whether ``compiled`` matches somewhere in ``text`` (JSON Schema's ``pattern``)."""
    return compiled.search(text_bytes(text)) is not None


def escape(text: str) -> str:
    """``text`` as a pattern that matches exactly it."""
    return str(re2.escape(text))
