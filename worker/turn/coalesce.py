"""Text read together, published together (``HARNESS_COALESCE_TEXT_CHARS``).

A harness that writes its text a line at a time makes one ``assistant-text`` stream entry per
line, and one entry per line is the stream's floor: a gigabyte of 1 KiB lines is a million
XADDs (docs/performance.md, row 6). With a bound set, consecutive ``assistant-text`` events
of one batch of output (what had already arrived when the worker read it) become one event
holding their text, up to the bound. Nothing waits for more output to merge with, so no text
reaches a consumer later than it would have; ids stay ``{turn}-{seq}``, one per entry, and the
order of the turn's events is kept (an event of another type ends a merge).
"""

from __future__ import annotations

from adapters.events import AssistantText, Event


def coalesce_text(events: list[Event], max_chars: int) -> list[Event]:
    """``events`` with each run of consecutive ``assistant-text`` merged into events of at
    most ``max_chars`` characters (a single longer text stays whole: it is one line)."""
    out: list[Event] = []
    parts: list[str] = []
    size = 0
    for event in events:
        if type(event) is AssistantText:
            text = event.text
            if parts and size + len(text) > max_chars:
                out.append(_merged(parts))
                parts, size = [], 0
            parts.append(text)
            size += len(text)
            continue
        if parts:
            out.append(_merged(parts))
            parts, size = [], 0
        out.append(event)
    if parts:
        out.append(_merged(parts))
    return out


def _merged(parts: list[str]) -> AssistantText:
    if len(parts) == 1:
        return AssistantText.model_construct(text=parts[0])
    return AssistantText.model_construct(text="".join(parts))
