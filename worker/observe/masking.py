"""Masking granted secret values out of text the worker publishes, logs or keeps."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

MASK = "[masked]"


class Masker:
    """Replaces granted secret values wherever they appear in published text."""

    def __init__(self, secrets: Mapping[str, str] | Iterable[str] = ()) -> None:
        values = secrets.values() if isinstance(secrets, Mapping) else secrets
        forms: set[str] = set()
        for value in values:
            if len(value) < 4:  # too short to mask without destroying ordinary text
                continue
            forms.add(value)
            forms.add(json.dumps(value, ensure_ascii=False)[1:-1])
            forms.add(json.dumps(value)[1:-1])
        self._forms = sorted(forms, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def mask(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return text
