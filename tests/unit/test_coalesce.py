"""Text read together, published together: worker/turn/coalesce.py."""

from __future__ import annotations

from adapters.events import AssistantText, Event, SandboxActivity, Usage
from worker.turn.coalesce import coalesce_text


def _texts(events: list[Event]) -> list[str | None]:
    return [e.text if isinstance(e, AssistantText) else None for e in events]


def test_consecutive_text_merges_up_to_the_bound_and_keeps_the_order() -> None:
    tool = SandboxActivity(kind="command", description="ls")
    usage = Usage(input_tokens=1, output_tokens=2)
    events: list[Event] = [
        AssistantText(text="ab"),
        AssistantText(text="cd"),
        AssistantText(text="ef"),
        tool,
        AssistantText(text="gh"),
        usage,
    ]
    merged = coalesce_text(events, 4)
    assert _texts(merged) == ["abcd", "ef", None, "gh", None]
    assert merged[2] is tool and merged[4] is usage
    assert all(type(e) is AssistantText for e in merged if e.type == "assistant-text")
    assert merged[0].data_json() == '{"text":"abcd"}'


def test_a_text_longer_than_the_bound_stays_whole() -> None:
    long = "x" * 10
    merged = coalesce_text([AssistantText(text="a"), AssistantText(text=long)], 4)
    assert _texts(merged) == ["a", long]


def test_merging_again_changes_nothing_and_nothing_is_lost() -> None:
    events: list[Event] = [AssistantText(text=f"line {i}\n") for i in range(1000)]
    once = coalesce_text(events, 4096)
    assert "".join(str(t) for t in _texts(once)) == "".join(f"line {i}\n" for i in range(1000))
    assert all(len(str(t)) <= 4096 for t in _texts(once))
    assert len(once) < 5
    twice = coalesce_text(once, 4096)
    assert _texts(twice) == _texts(once)
