"""What `harness run/turn/events` print: for a person (plain or on a terminal), or JSON lines."""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import pytest

from worker.cli import render
from worker.cli.render import Renderer
from worker.client import StreamEvent

RUN_ID = "r" + "a" * 24
NOW = 1_800_000_000.0
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def turn(number: int = 1, harness: str = "stdio-json", t0: float = 1000.0) -> list[StreamEvent]:
    """A text-and-tool turn as the demo harness streams it."""
    raw: list[tuple[str, dict[str, Any]]] = [
        ("turn-started", {"harness": harness, "attempt": 1, "input_chars": 5}),
        ("session", {"session_id": "demo-abc", "resumed": number > 1, "model": "demo-1"}),
        ("assistant-text", {"text": "Looking at the file"}),
        ("sandbox-activity", {"kind": "command", "description": "wc -w input.txt"}),
        ("assistant-text", {"text": "You said: hello"}),
        (
            "usage",
            {
                "input_tokens": 1200,
                "output_tokens": 34,
                "cached_input_tokens": 0,
                "cost_usd": 0.0123,
                "source": "harness",
            },
        ),
        (
            "turn-complete",
            {
                "text": "You said: hello",
                "session_id": "demo-abc",
                "model": "demo-1",
                "input_tokens": 1200,
                "output_tokens": 34,
                "cost_usd": 0.0123,
                "exit_code": 0,
            },
        ),
    ]
    return [
        StreamEvent(f"{number}-{seq}", kind, data, t0 + seq * 0.5)
        for seq, (kind, data) in enumerate(raw)
    ]


def failed_turn(number: int = 2) -> list[StreamEvent]:
    return [
        StreamEvent(
            f"{number}-0",
            "turn-started",
            {"harness": "stdio-json", "attempt": 1, "input_chars": 3},
            2000.0,
        ),
        StreamEvent(
            f"{number}-1",
            "session-error",
            {
                "error": "the turn timed out",
                "reason": "timeout",
                "retryable": True,
                "retry_after_s": 30,
                "exit_code": None,
                "stderr_tail": "first\nlast words",
            },
            2012.5,
        ),
    ]


RECORD = {
    "run_id": RUN_ID,
    "status": "idle",
    "turns": 1,
    "input_tokens": 1200,
    "output_tokens": 34,
    "cost_usd": 0.0123,
    "model_reported": "demo-1",
    "session_id": "demo-abc",
}


def rendered(events: list[StreamEvent], *, json_output: bool = False, **kwargs: Any) -> str:
    out = io.StringIO()
    r = Renderer(json_output, out, **kwargs)
    r.accepted(RUN_ID, events[0].turn)
    for event in events:
        r.event(event)
    r.summary(RECORD, events[-1])
    r.close()
    return out.getvalue()


def test_json_output_is_one_object_per_line_and_nothing_else() -> None:
    events = turn() + failed_turn()
    lines = rendered(events, json_output=True, terminal=True).splitlines()
    objects = [json.loads(line) for line in lines]  # raises on anything that is not JSON
    assert objects[0] == {"run_id": RUN_ID, "turn": 1}
    assert objects[1:] == [e.as_dict() for e in events]
    assert not ANSI.search("\n".join(lines))


def test_plain_output_has_no_escape_codes_and_the_run_id_first() -> None:
    text = rendered(turn())
    assert not ANSI.search(text)
    lines = text.splitlines()
    assert lines[0] == RUN_ID
    assert "Looking at the file" in lines
    assert "You said: hello" in lines
    assert "  $ wc -w input.txt" in lines


def test_terminal_output_is_coloured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    text = rendered(turn(), terminal=True)
    assert ANSI.search(text)
    assert "You said: hello" in ANSI.sub("", text)


def test_closing_line_shows_duration_tokens_cost_model_and_session() -> None:
    lines = rendered(turn()).splitlines()
    done = lines.index("✓ turn 1 complete")
    facts = lines[done + 1]
    assert facts.strip().split(" · ") == [
        "3.0s",
        "tokens 1200 in / 34 out",
        "$0.0123",
        "model demo-1",
        "session demo-abc",
    ]
    assert lines[-1].startswith(f"run {RUN_ID} · idle · 1 turn · ")


def test_failed_turn_shows_reason_retry_hint_and_stderr_tail() -> None:
    lines = rendered(failed_turn()).splitlines()
    assert "✗ turn 2 failed (timeout): the turn timed out · retryable after 30s" in lines
    assert "  │ last words" in lines
    assert any(line.strip().startswith("12.5s · tokens 0 in / 0 out · cost n/a") for line in lines)


def test_harness_text_is_never_markup_and_control_characters_are_shown() -> None:
    events = turn()
    events[2] = StreamEvent(
        "1-2", "assistant-text", {"text": "[bold]x[/bold] :smile: \x1b[31mred\x07"}, 1001.0
    )
    text = rendered(events, terminal=True)
    plain = ANSI.sub("", text)
    assert "[bold]x[/bold] :smile: ␛[31mred␇" in plain
    assert "\x07" not in text and "\x1b[31mred" not in text


def test_final_text_is_printed_when_it_was_not_streamed() -> None:
    events = [e for e in turn() if e.type != "assistant-text"]
    assert "You said: hello" in rendered(events).splitlines()


def test_final_text_already_streamed_is_not_repeated() -> None:
    assert rendered(turn()).splitlines().count("You said: hello") == 1


def test_delta_text_is_joined_as_it_arrives() -> None:
    events = turn(harness="gemini")
    events[2] = StreamEvent("1-2", "assistant-text", {"text": "You said: "}, 1001.0)
    events[4] = StreamEvent("1-4", "assistant-text", {"text": "hello"}, 1002.0)
    lines = rendered(events).splitlines()
    assert "You said: " in lines  # the tool line ends the first piece's line
    events.pop(3)  # without the tool line the pieces are one line
    assert "You said: hello" in rendered(events).splitlines()


def test_unknown_event_type_is_shown_not_hidden() -> None:
    events = [*turn()[:2], StreamEvent("1-2", "future-thing", {"x": 1}, 1001.0)]
    assert 'future-thing {"x": 1}' in rendered(events)


def test_spinner_runs_while_waiting_and_is_gone_after_the_terminal_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(render, "SPINNER_DELAY_S", 0.01)
    out = io.StringIO()
    r = Renderer(False, out, terminal=True)
    events = turn()
    for event in events[:3]:
        r.event(event)
    time.sleep(0.4)
    assert r._spinner is not None and r._spinner._live is not None
    assert "thinking…" in ANSI.sub("", out.getvalue())
    frames = set(re.findall("[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", out.getvalue()))
    assert len(frames) > 1  # it spins, not just sits there
    for event in events[3:]:
        r.event(event)
    assert r._spinner._live is None and r._spinner._timer is None
    r.close()


def test_no_spinner_when_not_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "SPINNER_DELAY_S", 0.01)
    out = io.StringIO()
    r = Renderer(False, out)
    r.event(turn()[0])
    time.sleep(0.2)
    assert r._spinner is None
    assert "thinking" not in out.getvalue()


def test_record_prints_key_value_lines_when_piped() -> None:
    out = io.StringIO()
    Renderer(False, out).record({"run_id": RUN_ID, "status": "idle", "x": None}, now=NOW)
    assert out.getvalue().splitlines() == [
        "status  idle",
        f"run_id  {RUN_ID}",
        "x       -",
    ]


STATUS_RECORD: dict[str, Any] = {
    "carry": {},
    "options": {
        "harness": "stdio-json",
        "model": "foo",
        "system_prompt": None,
        "posture": "auto",
        "allow": [],
        "grants": ["DEMO_TOKEN"],
        "executable": "harness-demo",
        "timeout_s": 30.0,
    },
    "model_requested": "foo",
    "queue": "harness.host.local.vm",
    "run_id": RUN_ID,
    "turns": 2,
    "warnings": ["first warning", "second warning"],
    "cost_usd": None,
    "status": "idle",
    "resumed": False,
    "created_at": NOW - 180,
    "updated_at": NOW - 5,
    "lease_until": NOW + 3540,
    "future_field": 7,
    "waiting_for_worker": None,
}


def status_lines(record: dict[str, Any]) -> list[str]:
    out = io.StringIO()
    Renderer(False, out).record(record, now=NOW)
    return out.getvalue().splitlines()


def local(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def test_status_shows_the_status_first_and_unknown_fields_last() -> None:
    lines = status_lines(STATUS_RECORD)
    assert lines[0].split() == ["status", "idle"]
    assert lines[1].startswith("warnings ")
    assert lines[-1].split() == ["future_field", "7"]


def test_status_times_are_local_dates_with_how_long_ago_or_how_soon() -> None:
    rows = dict(render.record_rows(STATUS_RECORD, now=NOW))
    assert rows["created_at"] == f"{local(NOW - 180)} (3m ago)"
    assert rows["updated_at"] == f"{local(NOW - 5)} (5s ago)"
    assert rows["lease_until"] == f"{local(NOW + 3540)} (in 59m)"


def test_status_shows_options_as_key_value_lines_and_warnings_one_per_line() -> None:
    rows = dict(render.record_rows(STATUS_RECORD, now=NOW))
    assert rows["options"].splitlines() == [
        "harness=stdio-json",
        "model=foo",
        "posture=auto",
        'grants=["DEMO_TOKEN"]',
        "executable=harness-demo",
        "timeout_s=30.0",
    ]
    assert rows["warnings"].splitlines() == ["first warning", "second warning"]
    assert rows["carry"] == "(none)"
    assert rows["resumed"] == "no"
    assert rows["cost_usd"] == "-"
    assert "waiting_for_worker" not in rows and "waiting" not in rows
    text = "\n".join(value for _, value in render.record_rows(STATUS_RECORD, now=NOW))
    assert "{" not in text.replace('["DEMO_TOKEN"]', "")  # no raw JSON object anywhere


def test_status_continuation_lines_are_aligned_when_piped() -> None:
    lines = status_lines(STATUS_RECORD)
    at = next(i for i, line in enumerate(lines) if line.startswith("options "))
    column = lines[at].index("harness=")
    assert lines[at + 1] == " " * column + "model=foo"


def test_status_cuts_a_long_text_in_the_options() -> None:
    record = {**STATUS_RECORD, "options": {"system_prompt": "x" * 10_000}}
    value = dict(render.record_rows(record, now=NOW))["options"]
    assert value.startswith("system_prompt=xxx") and len(value) < 200


def test_status_json_is_the_typed_record_unchanged() -> None:
    out = io.StringIO()
    Renderer(True, out).record(STATUS_RECORD, now=NOW)
    assert json.loads(out.getvalue()) == STATUS_RECORD
    assert len(out.getvalue().splitlines()) == 1


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s"), (59, "59s"), (180, "3m"), (7500, "2h05m"), (360000, "4d4h")]
)
def test_distances_are_coarse(seconds: float, shown: str) -> None:
    assert render.format_distance(seconds) == shown


def test_summary_says_when_the_stream_ended_without_a_terminal() -> None:
    out = io.StringIO()
    Renderer(False, out).summary(RECORD, None)
    assert "the stream ended before the turn's terminal event" in out.getvalue()


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.42, "0.4s"), (59.9, "59.9s"), (61, "1m01s"), (3725, "1h02m")]
)
def test_durations_read_naturally(seconds: float, shown: str) -> None:
    assert render.format_duration(seconds) == shown


# -- notices: a turn waiting for a worker, an end waiting for its teardown -----------------------

WAITING = {
    "notice": "waiting",
    "for": "turn",
    "run_id": RUN_ID,
    "turn": 1,
    "queue": "harness.stdio-json",
    "since": NOW - 4,
    "bound_s": None,
}


def test_waiting_text_names_the_queue_and_the_time() -> None:
    text = render.waiting_text(WAITING, now=NOW)
    clock = time.strftime("%H:%M:%S", time.localtime(NOW - 4))
    assert text.startswith(f"waiting for a worker on harness.stdio-json since {clock} (4.0s ago)")
    assert text.endswith("the turn stays queued until one starts")


def test_waiting_text_says_the_bound_of_a_host_queue() -> None:
    notice = {**WAITING, "queue": "harness.host.docker.abc", "bound_s": 600.0}
    text = render.waiting_text(notice, now=NOW)
    assert "waiting for a worker on harness.host.docker.abc since" in text
    assert "the turn waits up to 600 s for a worker there" in text


def test_notice_goes_to_stderr_for_a_person_and_stdout_stays_the_run_id() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = Renderer(False, out, err=err)
    r.accepted(RUN_ID, 1)
    r.notice(WAITING)
    r.close()
    assert out.getvalue().splitlines() == [RUN_ID]
    assert err.getvalue().startswith("harness: waiting for a worker on harness.stdio-json since ")


def test_notice_is_a_json_line_after_the_accepted_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = Renderer(True, out, err=err)
    r.accepted(RUN_ID, 1)
    r.notice(WAITING)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [{"run_id": RUN_ID, "turn": 1}, WAITING]
    assert err.getvalue() == ""


def test_teardown_notice_says_what_end_waits_for() -> None:
    err = io.StringIO()
    r = Renderer(False, io.StringIO(), err=err)
    notice = {"notice": "waiting", "for": "teardown", "run_id": RUN_ID}
    r.notice({**notice, "queue": "harness.host.local.a", "alive": True, "timeout_s": 60.0})
    r.notice({**notice, "queue": "harness.host.local.b", "alive": False, "timeout_s": 60.0})
    first, second = err.getvalue().splitlines()
    assert first == (
        "harness: waiting for a worker on harness.host.local.a to tear the run down… (up to 60s)"
    )
    assert "no live worker consumes that queue now" in second
    assert "the reaper removes its sandbox" in second


def test_outage_and_recovery_are_said_on_stderr_in_json_mode_too() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = Renderer(True, out, err=err)
    r.outage("cannot reach Redis: connection refused")
    r.recovered("1-4")
    assert out.getvalue() == ""
    assert err.getvalue().splitlines() == [
        "harness: Redis is unreachable; retrying… (cannot reach Redis: connection refused)",
        "harness: Redis is back; resuming after 1-4",
    ]


def test_record_shows_a_waiting_turn_as_a_sentence() -> None:
    out = io.StringIO()
    Renderer(False, out).record({**RECORD, "status": "starting", "waiting_for_worker": WAITING})
    lines = out.getvalue().splitlines()
    waiting = next(line for line in lines if line.startswith("waiting "))
    assert "waiting for a worker on harness.stdio-json since" in waiting
    assert not any(line.startswith("waiting_for_worker") for line in lines)


def test_workspace_event_reads_as_one_line_of_what_changed() -> None:
    from worker.cli.render import workspace_text

    changed = {
        "snapshot": "abcdef1234567890",
        "added_count": 1,
        "modified_count": 2,
        "lines_added": 3,
        "lines_removed": 1,
        "pushed_branch": "agent/x",
    }
    assert workspace_text(changed) == (
        "workspace: 1 added, 2 modified (+3 -1 lines) · snapshot abcdef123456 · pushed to agent/x"
    )
    rewind = {"snapshot": "abc", "rewound_to": 0, "deleted_count": 1, "note": "a\nb"}
    assert workspace_text(rewind).startswith("workspace rewound to turn 0: 1 deleted")
    assert "\n" not in workspace_text(rewind)
    assert workspace_text({"snapshot": ""}) == "workspace: no change · snapshot none"


def test_tool_calls_show_the_server_the_tool_its_input_and_how_the_result_went() -> None:
    events = [
        StreamEvent(
            "1-0", "turn-started", {"harness": "stdio-json", "attempt": 1, "input_chars": 3}, 1.0
        ),
        StreamEvent(
            "1-1",
            "tool-call",
            {
                "call_id": "t1-1",
                "server": "orders",
                "tool": "lookup",
                "input": '{"id": 7}',
                "input_chars": 9,
            },
            1.1,
        ),
        StreamEvent(
            "1-2",
            "tool-result",
            {
                "call_id": "t1-1",
                "ok": False,
                "output": "no such order",
                "output_chars": 13,
                "duration_ms": 42,
            },
            1.2,
        ),
    ]
    text = rendered(events)
    assert "orders.lookup" in text and '{"id": 7}' in text
    assert "✗ t1-1" in text and "42 ms, 13 chars: no such order" in text
