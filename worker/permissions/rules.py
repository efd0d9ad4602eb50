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
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable

from adapters.asks import Ask

SHELL = frozenset(
    {"bash", "shell", "execute", "run_shell_command", "exec_command", "shell_command"}
)
_PATTERN = re.compile(r"^\s*([^()\s]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def _family(tool: str) -> str:
    name = tool.strip().lower()
    return "shell" if name in SHELL else name


def _subject(ask: Ask) -> str:
    if ask.command:
        return ask.command
    try:
        return json.dumps(ask.input, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(ask.input)


def matches(pattern: str, ask: Ask) -> bool:
    parsed = _PATTERN.match(pattern)
    if parsed is None:
        return False
    tool, glob = parsed.group(1), parsed.group(2)
    if _family(tool) != _family(ask.tool):
        return False
    if glob is None or glob.strip() in ("", "*"):
        return True
    glob = glob.strip()
    if glob.endswith(":*"):
        glob = glob[:-2] + "*"
    return fnmatch.fnmatchcase(_subject(ask), glob)


def first_match(patterns: Iterable[str], ask: Ask) -> str | None:
    return next((p for p in patterns if matches(p, ask)), None)


def decide(allow: Iterable[str], deny: Iterable[str], ask: Ask) -> tuple[bool, str] | None:
    """``(allowed, by)`` when a pattern settles the request (deny wins), else None."""
    denied = first_match(deny, ask)
    if denied is not None:
        return False, f"rule:deny:{denied}"
    allowed = first_match(allow, ask)
    if allowed is not None:
        return True, f"rule:allow:{allowed}"
    return None
