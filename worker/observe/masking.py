"""Masking granted secret values out of text the worker publishes, logs or keeps."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

MASK = "[masked]"


class Masker:
    """Replaces granted secret values wherever they appear in published text.

    Each form of each value is looked for on its own, as a literal pattern (``re`` searches
    one literal with an overlap table: 1.8-3.6 GB/s on any text, where Python's substring
    search fell to ~0.4 GB/s for some values in long runs of one character, and one
    alternation of forms that begin with different characters to ~0.2 GB/s on all text;
    docs/performance.md, row 6). Text holding none, nearly all of it, is returned as it came;
    otherwise one alternation masks every form in one pass, so a match is masked once:
    ``[masked]`` is never searched again.
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
        self._finders = [re.compile(re.escape(form)).search for form in ordered]

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not any(find(text) for find in self._finders):
            return text
        return pattern.sub(MASK, text)
