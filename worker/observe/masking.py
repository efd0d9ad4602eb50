"""Masking granted secret values out of text the worker publishes, logs or keeps."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

MASK = "[masked]"


class Masker:
    """Replaces granted secret values wherever they appear in published text.

    Every form of every value is one alternation, searched in one pass: the cost is the same
    for one secret or ten, and for any text. Python's substring search, once per form, ran at
    2-6 GB/s on most text but at ~0.25 GB/s for some values in long runs of one character
    (those sharing a character with the run modulo 64, which its skip table cannot tell
    apart): a turn's cost then depended on the random stand-in it was given
    (docs/performance.md, row 6). A match is masked once: ``[masked]`` is never searched again.
    """

    def __init__(self, secrets: Mapping[str, str] | Iterable[str] = ()) -> None:
        values = secrets.values() if isinstance(secrets, Mapping) else secrets
        forms: set[str] = set()
        for value in values:
            if len(value) < 4:  # too short to mask without destroying ordinary text
                continue
            forms.add(value)
            forms.add(json.dumps(value, ensure_ascii=False)[1:-1])
            forms.add(json.dumps(value)[1:-1])
        # Longest first: where two forms start at one place, the longer is masked whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or pattern.search(text) is None:
            return text
        return pattern.sub(MASK, text)
