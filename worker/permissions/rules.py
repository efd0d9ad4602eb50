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
worker, for each such rule). A glob is matched by RE2 instead (worker/options/tool_patterns.py:
linear in the command, the GIL released), whose ``check_pattern`` refuses, where the options
are checked, a glob RE2 cannot compile, so that no ``--deny`` is ever skipped.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

from adapters.asks import Ask
from worker.options.schema_regex import text_bytes
from worker.options.tool_patterns import compiled_glob, glob_of

SHELL = frozenset(
    {"bash", "shell", "execute", "run_shell_command", "exec_command", "shell_command"}
)


def _family(tool: str) -> str:
    name = tool.strip().lower()
    return "shell" if name in SHELL else name


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
    parsed = glob_of(pattern)
    if parsed is None or _family(parsed[0]) != _family(subject.ask.tool):
        return False
    return parsed[1] is None or compiled_glob(parsed[1]).fullmatch(subject.data) is not None


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
