"""Fields of a harness's JSON, read without trusting them to have the documented types.

A vendor stream may omit a field, send ``null``, or change a type between versions; a mapping
reads every value through one of these and gets a safe default instead of an exception.
"""

from __future__ import annotations

from typing import Any


def count(value: Any) -> int:
    """A token count: a non-negative integer (not a bool), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def text(value: Any) -> str:
    """A string, else ``""``."""
    return value if isinstance(value, str) else ""


def nonempty(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def mapping(value: Any) -> dict[str, Any]:
    """A JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    """A JSON array, else an empty one (a string or an object is no list of items)."""
    return value if isinstance(value, list) else []
