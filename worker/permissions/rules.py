"""A run's ``--allow`` and ``--deny`` patterns, applied by the worker to every permission
request of ``--posture ask`` before anyone is asked (deny first, then allow).

The CLIs name their tools differently, so a pattern names a tool as any of them does and the
shell family is one tool: ``Bash``, ``bash``, ``shell``, ``execute`` (ACP's kind),
``run_shell_command``, ``exec_command`` and ``shell_command`` all match one another. Forms:

- ``TOOL``: every call of that tool;
- ``TOOL(GLOB)``: a call whose command (or, without one, its input as JSON) matches the
  shell-style ``GLOB``; Claude Code's ``TOOL(PREFIX:*)`` means ``TOOL(PREFIX*)``.

Names are compared without case. A pattern that matches a request answers it at once, with
``by`` naming the rule (``rule:deny:PATTERN`` or ``rule:allow:PATTERN``).

A ``GLOB`` is the producer's and the command the model's (up to a line's 8 MiB): ``fnmatch``
would match them with Python's ``re``, whose time grows with both and which holds the GIL
(``*`` and 498 characters took seconds against a long command, on every thread of the
worker, for each such rule). A glob is matched by RE2 instead (``glob_regex``): linear in the
command, the GIL released. ``check_pattern`` refuses, where the options are checked, a glob
RE2 cannot compile, so that no ``--deny`` is ever skipped.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from adapters.asks import Ask
from worker.options.schema_regex import compile_pattern, escape, text_bytes

SHELL = frozenset(
    {"bash", "shell", "execute", "run_shell_command", "exec_command", "shell_command"}
)
_PATTERN = re.compile(r"^\s*([^()\s]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def _family(tool: str) -> str:
    name = tool.strip().lower()
    return "shell" if name in SHELL else name


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


@functools.lru_cache(maxsize=256)
def _compiled(glob: str) -> Any:
    return compile_pattern(glob_regex(glob))


def _glob_of(pattern: str) -> tuple[str, str | None] | None:
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
    parsed = _glob_of(pattern)
    if parsed is not None and parsed[1] is not None:
        _compiled(parsed[1])


def _subject(ask: Ask) -> str:
    if ask.command:
        return ask.command
    try:
        return json.dumps(ask.input, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(ask.input)


class _Subject:
    """What a request's globs are matched against, made once for all its patterns."""

    def __init__(self, ask: Ask) -> None:
        self.ask = ask

    @functools.cached_property
    def data(self) -> bytes:
        return text_bytes(_subject(self.ask))


def _matches(pattern: str, subject: _Subject) -> bool:
    parsed = _glob_of(pattern)
    if parsed is None or _family(parsed[0]) != _family(subject.ask.tool):
        return False
    return parsed[1] is None or _compiled(parsed[1]).fullmatch(subject.data) is not None


def matches(pattern: str, ask: Ask) -> bool:
    return _matches(pattern, _Subject(ask))


def first_match(patterns: Iterable[str], ask: Ask) -> str | None:
    subject = _Subject(ask)
    return next((p for p in patterns if _matches(p, subject)), None)


def decide(allow: Iterable[str], deny: Iterable[str], ask: Ask) -> tuple[bool, str] | None:
    """``(allowed, by)`` when a pattern settles the request (deny wins), else None."""
    denied = first_match(deny, ask)
    if denied is not None:
        return False, f"rule:deny:{denied}"
    allowed = first_match(allow, ask)
    if allowed is not None:
        return True, f"rule:allow:{allowed}"
    return None
