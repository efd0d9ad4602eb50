"""The producer's ``--allow``/``--deny`` patterns as text: ``TOOL`` or ``TOOL(GLOB)`` parsed,
and a ``GLOB`` compiled for RE2 (linear in the command it is matched against, the GIL
released), so that the options can refuse, where they are checked, a glob RE2 cannot compile
and no ``--deny`` is ever skipped. worker/permissions/rules.py matches them.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from typing import Any

from worker.options.schema_regex import compile_pattern, escape

_PATTERN = re.compile(r"^\s*([^()\s]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


_NEVER = r"[^\x00-\x{10FFFF}]"


def glob_regex(glob: str) -> str:
    """``glob`` as an RE2 pattern for a whole subject, read as ``fnmatch`` reads it: ``*``
    any run, ``?`` one character, ``[...]`` and ``[!...]`` a set (``fnmatch.translate``
    writes each set), anything else itself."""
    parts: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if not parts or parts[-1] != ".*":
                parts.append(".*")
        elif c == "?":
            parts.append(".")
        elif c == "[":
            j = i + 1 if i < n and glob[i] == "!" else i
            j = j + 1 if j < n and glob[j] == "]" else j
            j = glob.find("]", j)
            if j < 0:
                parts.append(escape("["))
                continue
            # "(?s:[...])\Z", "(?s:.)\Z" or "(?s:(?!))\Z" (a set with nothing in it).
            one = fnmatch.translate(glob[i - 1 : j + 1])
            one = one.removeprefix("(?s:").removesuffix(")\\Z")
            parts.append(_NEVER if one == "(?!)" else one)
            i = j + 1
        else:
            parts.append(escape(c))
    return "(?s)" + "".join(parts)


GLOB_MAX_MEM = 8 << 20
"""RE2's memory for one glob: enough for its DFA to stay a DFA against a command of several
MiB, matched on every request (worker/options/schema_regex.py, ``MAX_MEM``)."""


@functools.lru_cache(maxsize=32)  # at most 32 x GLOB_MAX_MEM of DFAs kept by a process
def compiled_glob(glob: str) -> Any:
    return compile_pattern(glob_regex(glob), max_mem=GLOB_MAX_MEM)


def glob_of(pattern: str) -> tuple[str, str | None] | None:
    """``(TOOL, GLOB)`` of a pattern (GLOB None: every call), or None: not a pattern."""
    parsed = _PATTERN.match(pattern)
    if parsed is None:
        return None
    tool, glob = parsed.group(1), parsed.group(2)
    if glob is None or glob.strip() in ("", "*"):
        return tool, None
    glob = glob.strip()
    return tool, glob[:-2] + "*" if glob.endswith(":*") else glob


def check_pattern(pattern: str) -> None:
    """PatternError (``worker.options.schema_regex``) when the pattern's GLOB cannot be
    matched in linear time."""
    parsed = glob_of(pattern)
    if parsed is not None and parsed[1] is not None:
        compiled_glob(parsed[1])
