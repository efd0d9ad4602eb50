"""The input and label templates of a trigger: ``{issue.title}`` filled from a payload.

Deliberately not ``str.format``: a placeholder is a dotted path of plain keys into JSON
objects, nothing else. No attribute is ever read (``{__class__}``, ``{issue.__dict__}`` are
not placeholders: a key may not start with ``_``), no conversion (``!r``) or format spec
(``:>99999``) exists, no list is indexed, and what a payload's value holds is inserted as it
is, never expanded again. Each value is cut to :data:`VALUE_MAX_CHARS` and the whole text to
:data:`TEXT_MAX_CHARS`, so a payload cannot make an input of any size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from worker.errors import InvalidInput

TEMPLATE_MAX_CHARS = 20_000
VALUE_MAX_CHARS = 20_000
TEXT_MAX_CHARS = 100_000
_KEY = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
PATH = re.compile(rf"{_KEY}(?:\.{_KEY}){{0,7}}")
"""A placeholder's path: up to 8 keys, each starting with a letter or a digit."""
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def check_template(template: str, what: str = "input template") -> str:
    """``template`` when every ``{...}`` in it is a placeholder (``{{`` and ``}}`` are
    braces); InvalidInput naming the first that is not."""
    if not isinstance(template, str) or len(template) > TEMPLATE_MAX_CHARS:
        raise InvalidInput(f"the {what} must be text of at most {TEMPLATE_MAX_CHARS} characters")
    for match in _TOKEN.finditer(template):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        inner = match.group(1)
        if inner is None or not PATH.fullmatch(inner):
            raise InvalidInput(
                f"the {what} has {token[:80]!r}, which is no placeholder: a placeholder is "
                "{KEY.KEY...} of keys of letters, digits, '_' or '-', each starting with a "
                "letter or a digit ('{{' and '}}' are braces)"
            )
    return template


def lookup(payload: object, path: str) -> str:
    """The text at ``path`` in ``payload``: a string as it is, a number or a boolean as JSON
    writes it, anything else (absent, null, an object, a list) nothing."""
    found: object = payload
    for key in path.split("."):
        if not isinstance(found, Mapping) or key not in found:
            return ""
        found = found[key]
    if isinstance(found, str):
        return found[:VALUE_MAX_CHARS]
    if isinstance(found, bool | int | float):
        return json.dumps(found)
    return ""


def render(template: str, payload: object) -> str:
    """``template`` with each placeholder's value from ``payload``; what is not a placeholder
    stays as written (a checked template has none such)."""

    def fill(match: re.Match[str]) -> str:
        token, inner = match.group(0), match.group(1)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        if inner is not None and PATH.fullmatch(inner):
            return lookup(payload, inner)
        return token

    return _TOKEN.sub(fill, template)[:TEXT_MAX_CHARS]


_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.:@/+\-]+")


def label_value(text: str) -> str:
    """A rendered label value as a run's label may hold it (what it may not: ``-``)."""
    return _NOT_LABEL.sub("-", text)[:200]
