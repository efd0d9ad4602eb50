"""The closed event set: model, committed schema, wire round trip, contract defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from adapters.events import (
    EVENT_TYPES,
    TERMINAL_TYPES,
    AssistantText,
    PermissionRequest,
    SandboxActivity,
    Session,
    SessionError,
    TurnComplete,
    TurnStarted,
    Usage,
    WorkspaceChange,
    json_schema,
    parse_event,
    session_error,
    utf8_safe,
)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "adapters" / "events.schema.json"

# docs/events.md, "Events": every type and the JSON type(s) of each data field, written out
# here independently of the models so that a drift on either side fails.
STRING = {"string"}
OPT_STRING = {"string", "null"}
INT = {"integer"}
OPT_INT = {"integer", "null"}
NUMBER = {"number"}
OPT_NUMBER = {"number", "null"}
BOOL = {"boolean"}
ARRAY = {"array"}

CONTRACT_EVENTS: dict[str, dict[str, set[str]]] = {
    "turn-started": {  # trace_id: traces (docs/events.md)
        "harness": STRING,
        "attempt": INT,
        "input_chars": INT,
        "trace_id": OPT_STRING,
    },
    "session": {"session_id": STRING, "resumed": BOOL, "model": OPT_STRING},
    "assistant-text": {"text": STRING},
    "sandbox-activity": {  # host, port, denied: kind network (docs/events.md)
        "kind": STRING,
        "description": STRING,
        "host": OPT_STRING,
        "port": OPT_INT,
        "denied": {"boolean", "null"},
    },
    "permission-request": {  # tool .. deadline: --posture ask (docs/events.md)
        "request_id": STRING,
        "description": STRING,
        "command": OPT_STRING,
        "tool": OPT_STRING,
        "input": OPT_STRING,
        "input_chars": OPT_INT,
        "deadline": OPT_NUMBER,
    },
    "permission-decision": {
        "request_id": STRING,
        "decision": STRING,
        "scope": STRING,
        "by": STRING,
        "message": OPT_STRING,
    },
    "tool-call": {  # docs/events.md (tools for the agent)
        "call_id": STRING,
        "server": STRING,
        "tool": STRING,
        "input": STRING,
        "input_chars": INT,
    },
    "tool-result": {
        "call_id": STRING,
        "ok": BOOL,
        "output": STRING,
        "output_chars": INT,
        "duration_ms": INT,
    },
    "workspace": {  # docs/events.md, and docs/events.md
        "snapshot": STRING,
        "added": ARRAY,
        "modified": ARRAY,
        "deleted": ARRAY,
        "added_count": INT,
        "modified_count": INT,
        "deleted_count": INT,
        "lines_added": INT,
        "lines_removed": INT,
        "large": ARRAY,
        "complete": BOOL,
        "note": OPT_STRING,
        "rewound_to": OPT_INT,
        "pushed_branch": OPT_STRING,
    },
    "usage": {
        "input_tokens": INT,
        "output_tokens": INT,
        "cached_input_tokens": INT,
        "cost_usd": OPT_NUMBER,
        "source": STRING,
        "model": OPT_STRING,  # docs/events.md: source gateway only
    },
    "parked": {"resume_at": NUMBER, "reason": STRING, "next_turn": INT},
    "user-message": {
        "text": STRING,
        "mode": STRING,
        "by": STRING,
        "delivery": STRING,
        "message_id": STRING,
    },
    "outcome-evaluation": {  # docs/events.md, "Outcomes"
        "iteration": INT,
        "satisfied": BOOL,
        "feedback": STRING,
        "grader_run_id": OPT_STRING,
        "input_tokens": INT,
        "output_tokens": INT,
        "cost_usd": OPT_NUMBER,
    },
    "turn-complete": {
        "text": STRING,
        "session_id": OPT_STRING,
        "model": OPT_STRING,
        "input_tokens": INT,
        "output_tokens": INT,
        "cost_usd": OPT_NUMBER,
        "exit_code": OPT_INT,
        # docs/events.md: the validated answer (any JSON value) with a schema
        "structured": {"object", "array", "string", "integer", "number", "boolean", "null"},
    },
    "session-error": {
        "error": STRING,
        "reason": STRING,
        "retryable": BOOL,
        "retry_after_s": OPT_NUMBER,
        "exit_code": OPT_INT,
        "stderr_tail": STRING,
    },
}

CONTRACT_ENUMS: dict[tuple[str, str], set[str]] = {
    ("sandbox-activity", "kind"): {"command", "file", "tool", "network", "model", "other"},
    ("usage", "source"): {"harness", "replay", "gateway", "grader"},
    ("permission-decision", "decision"): {"allow", "deny"},
    ("permission-decision", "scope"): {"once", "always"},
    ("session-error", "reason"): {
        "rate-limited",
        "quota",
        "auth",
        "harness-error",
        "exit",
        "timeout",
        "cancelled",
        "shutdown",
        "worker-lost",
        "sandbox",
        "invalid-input",
        "internal",  # docs/events.md
        "budget",  # docs/events.md
        "invalid-output",  # docs/events.md
    },
}

# docs/events.md, the reason table's "retryable" column, when nothing more is known.
CONTRACT_RETRYABLE = {
    "rate-limited": True,
    "quota": False,  # "yes when the reset time is known, else no"
    "auth": False,
    "harness-error": False,  # "as the harness marks it, else no"
    "exit": True,
    "timeout": True,
    "cancelled": False,
    "shutdown": True,
    "worker-lost": True,
    "sandbox": True,
    "invalid-input": False,
    "internal": True,
    "budget": False,  # docs/events.md: a run budget is spent
    "invalid-output": False,  # docs/events.md: the same answer again
}

SAMPLES = [
    TurnStarted(harness="stdio-json", attempt=2, input_chars=11),
    TurnStarted(harness="stdio-json", input_chars=3, trace_id="4bf92f3577b34da6a3ce929d0e0e4736"),
    Session(session_id="s-1", resumed=True, model="m-1"),
    Session(session_id="s-2", resumed=False),
    AssistantText(text='héllo\n"quoted"'),
    SandboxActivity(kind="command", description="ls -la"),
    SandboxActivity(
        kind="network",
        description="denied direct tcp 10.9.8.7:22",
        host="10.9.8.7",
        port=22,
        denied=True,
    ),
    PermissionRequest(request_id="p1", description="run rm", command="rm -rf x"),
    PermissionRequest(request_id="p2", description="edit", command=None),
    Usage(input_tokens=10, output_tokens=5, cached_input_tokens=3, cost_usd=0.25),
    WorkspaceChange(
        snapshot="0" * 40, added=("a.py",), modified=("b.txt",), added_count=1, lines_added=3
    ),
    WorkspaceChange(snapshot="1" * 40, rewound_to=0, complete=False, note="time bound"),
    Usage(input_tokens=7, source="replay"),
    TurnComplete(
        text="done",
        session_id="s-1",
        model="m-1",
        input_tokens=10,
        output_tokens=5,
        cost_usd=None,
        exit_code=0,
    ),
    session_error("boom", "rate-limited", retry_after_s=12.5, exit_code=1, stderr_tail="x\n"),
]


def _variants(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The schema's object definitions keyed by their ``type`` constant."""
    defs = schema["$defs"]
    out: dict[str, dict[str, Any]] = {}
    for definition in defs.values():
        const = definition["properties"]["type"]["const"]
        out[const] = definition
    return out


def _json_types(prop: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    if "$ref" in prop:
        return _json_types(defs[prop["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in prop:
        return set().union(*(_json_types(p, defs) for p in prop["anyOf"]))
    if "enum" in prop:
        return {prop.get("type", "string")}
    if "const" in prop:
        return {prop.get("type", "string")}
    return {prop["type"]}


def _enum(prop: dict[str, Any], defs: dict[str, Any]) -> set[str] | None:
    if "$ref" in prop:
        return _enum(defs[prop["$ref"].rsplit("/", 1)[1]], defs)
    return set(prop["enum"]) if "enum" in prop else None


def test_committed_schema_matches_models_when_generated() -> None:
    committed = json.loads(SCHEMA_PATH.read_text())
    assert committed == json_schema(), (
        "adapters/events.schema.json is out of date with adapters/events.py; regenerate it "
        "with `python -m adapters.events > adapters/events.schema.json` and review the diff"
    )


def test_event_types_match_contract_table() -> None:
    assert set(EVENT_TYPES) == set(CONTRACT_EVENTS)
    assert len(EVENT_TYPES) == len(set(EVENT_TYPES))
    assert set(_variants(json_schema())) == set(CONTRACT_EVENTS)
    assert {"turn-complete", "session-error"} == TERMINAL_TYPES


@pytest.mark.parametrize("event_type", sorted(CONTRACT_EVENTS))
def test_event_fields_match_contract_with_right_types(event_type: str) -> None:
    schema = json_schema()
    definition = _variants(schema)[event_type]
    props = {k: v for k, v in definition["properties"].items() if k != "type"}
    expected = CONTRACT_EVENTS[event_type]
    assert set(props) == set(expected), f"{event_type} data fields differ from docs/events.md"
    for name, types in expected.items():
        got = _json_types(props[name], schema.get("$defs", {}))
        assert got == types, f"{event_type}.{name}: schema says {got}, contract says {types}"
    assert definition.get("additionalProperties") is False


@pytest.mark.parametrize(("where", "values"), sorted(CONTRACT_ENUMS.items()))
def test_event_enums_match_contract_when_closed(where: tuple[str, str], values: set[str]) -> None:
    schema = json_schema()
    event_type, field = where
    prop = _variants(schema)[event_type]["properties"][field]
    assert _enum(prop, schema["$defs"]) == values


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_parse_event_round_trips_wire_form(event: Any) -> None:
    wire_type, wire_data = event.type, json.loads(event.data_json())
    assert "type" not in wire_data
    assert wire_data == event.data()
    again = parse_event(wire_type, wire_data)
    assert again == event
    assert type(again) is type(event)


def test_data_json_keeps_non_ascii_when_serialised() -> None:
    assert "é" in AssistantText(text="é").data_json()


@given(st.text())
def test_data_json_escapes_text_as_json_dumps_does(text: str) -> None:
    # The publisher's Masker looks for secrets in the forms json.dumps gives them.
    event = AssistantText(text=text)
    expected = json.dumps({"text": text}, ensure_ascii=False, separators=(",", ":"))
    assert event.data_json() == utf8_safe(expected)


def test_data_json_replaces_lone_surrogate_when_text_has_one() -> None:
    assert json.loads(AssistantText(text="a\ud800b").data_json()) == {"text": "a?b"}


def test_turn_started_data_leaves_trace_id_out_when_untraced() -> None:
    assert json.loads(TurnStarted(harness="pi", input_chars=1).data_json()) == {
        "harness": "pi",
        "attempt": 1,
        "input_chars": 1,
    }


def test_data_json_writes_null_when_cost_not_finite() -> None:
    assert json.loads(Usage(cost_usd=float("nan")).data_json())["cost_usd"] is None


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_terminal_property_true_only_for_terminal_types(event: Any) -> None:
    assert event.terminal is (event.type in TERMINAL_TYPES)


def test_parse_event_refuses_unknown_type() -> None:
    with pytest.raises(ValidationError):
        parse_event("assistant-thought", {"text": "x"})


def test_parse_event_refuses_extra_field() -> None:
    with pytest.raises(ValidationError):
        parse_event("assistant-text", {"text": "x", "secret": "y"})


def test_parse_event_refuses_missing_field() -> None:
    with pytest.raises(ValidationError):
        parse_event("session-error", {"error": "x", "reason": "exit"})


def test_parse_event_refuses_unknown_reason() -> None:
    with pytest.raises(ValidationError):
        parse_event("session-error", {"error": "x", "reason": "oops", "retryable": True})


def test_events_are_frozen() -> None:
    event = AssistantText(text="a")
    with pytest.raises(ValidationError):
        event.text = "b"  # type: ignore[misc]


@pytest.mark.parametrize(("reason", "retryable"), sorted(CONTRACT_RETRYABLE.items()))
def test_session_error_retryable_defaults_to_contract_table(reason: Any, retryable: bool) -> None:
    event = session_error("something failed", reason)
    assert isinstance(event, SessionError)
    assert event.reason == reason
    assert event.retryable is retryable


def test_session_error_reasons_cover_contract_table() -> None:
    schema = json_schema()
    prop = _variants(schema)["session-error"]["properties"]["reason"]
    assert _enum(prop, schema["$defs"]) == set(CONTRACT_RETRYABLE)


@pytest.mark.parametrize("reason", ["quota", "harness-error"])
def test_session_error_retryable_follows_harness_when_it_says(reason: Any) -> None:
    event = session_error("reset known", reason, retryable=True, retry_after_s=30.0)
    assert event.retryable is True
    assert event.retry_after_s == 30.0


def test_session_error_defaults_when_nothing_known() -> None:
    event = session_error("x", "exit")
    assert event.retry_after_s is None
    assert event.exit_code is None
    assert event.stderr_tail == ""
