"""Shared helpers for adapter tests: recorded fixtures, replay through the stream driver,
golden expected events.

Fixtures live in ``tests/fixtures/<harness-id>/``: ``<scenario>.ndjson`` (the harness's real
stdout), optionally ``<scenario>.stderr.txt`` and ``<scenario>.meta.json`` (how it was
recorded: ``exit_code`` and whatever else the recorder knows). The expected events of a
scenario are ``<scenario>.events.json``; run the tests with ``UPDATE_GOLDEN=1`` to rewrite
them, then review the diff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.events import Event
from adapters.protocol import Adapter, Command, ExitInfo, TurnRequest
from adapters.stream import StreamDriver

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MIB = 1024 * 1024
#: Linux's limit on one argv element (MAX_ARG_STRLEN): no argument may come near it.
ARG_MAX_STRLEN = 128 * 1024


def fixture_dir(harness_id: str) -> Path:
    return FIXTURES / harness_id


def scenarios(harness_id: str) -> list[str]:
    """Every recorded scenario of a harness (the ``*.ndjson`` names, sorted)."""
    return sorted(p.name.removesuffix(".ndjson") for p in fixture_dir(harness_id).glob("*.ndjson"))


def stdout_bytes(harness_id: str, scenario: str) -> bytes:
    return (fixture_dir(harness_id) / f"{scenario}.ndjson").read_bytes()


def stdout_lines(harness_id: str, scenario: str) -> list[bytes]:
    return [line for line in stdout_bytes(harness_id, scenario).splitlines() if line.strip()]


def meta(harness_id: str, scenario: str) -> dict[str, Any]:
    path = fixture_dir(harness_id) / f"{scenario}.meta.json"
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def stderr_text(harness_id: str, scenario: str) -> str:
    path = fixture_dir(harness_id) / f"{scenario}.stderr.txt"
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def exit_info(harness_id: str, scenario: str, default_code: int | None = 0) -> ExitInfo:
    """How the recorded process ended: ``exit_code`` from the meta file, else the default."""
    code = meta(harness_id, scenario).get("exit_code", default_code)
    return ExitInfo(
        exit_code=code if isinstance(code, int) else None,
        stderr_tail=stderr_text(harness_id, scenario),
    )


def replay(
    adapter: Adapter,
    request: TurnRequest,
    data: bytes | list[bytes],
    exit: ExitInfo,
    chunk_size: int | None = None,
) -> tuple[list[Event], StreamDriver]:
    """Feed recorded stdout through a fresh driver (in ``chunk_size`` pieces if given)."""
    if isinstance(data, list):
        data = b"".join(line + b"\n" for line in data)
    driver = StreamDriver(adapter, request)
    events = driver.start()
    step = chunk_size or max(len(data), 1)
    for start in range(0, len(data), step):
        events += driver.feed(data[start : start + step])
    events += driver.finish(exit)
    return events, driver


def event_dicts(events: list[Event]) -> list[dict[str, Any]]:
    return [{"type": event.type, "data": event.data()} for event in events]


def check_golden(path: Path, actual: Any) -> None:
    """Compare with the golden file; with ``UPDATE_GOLDEN=1`` rewrite it instead."""
    rendered = json.dumps(actual, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1 and review the diff"
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert actual == expected, f"{path.name} differs (UPDATE_GOLDEN=1 rewrites it)"


def by_type(events: list[Any], kind: str) -> list[Any]:
    """The events of one type, in order."""
    return [e for e in events if e.type == kind]


def event_types(events: list[Event]) -> list[str]:
    return [event.type for event in events]


#: The events of a turn answered in one reply, in order.
ONE_REPLY_TURN = ["turn-started", "session", "assistant-text", "usage", "turn-complete"]


def terminal_count(events: list[Event]) -> int:
    return sum(1 for event in events if event.terminal)


def assert_kept_stream_rules(events: list[Event], driver: StreamDriver) -> None:
    """The rules every adapter must keep on any input: the mapper never raises, the turn
    starts with ``turn-started`` and ends with exactly one terminal event, its last."""
    assert driver.counters.mapper_errors == 0, driver.last_mapper_error
    assert events[0].type == "turn-started"
    assert terminal_count(events) == 1
    assert events[-1].terminal


def assert_stream_rules(
    adapter: Adapter, request: TurnRequest, data: bytes | list[bytes], exit: ExitInfo
) -> list[Event]:
    """Replay ``data`` and check :func:`assert_kept_stream_rules` on what it made."""
    events, driver = replay(adapter, request, data, exit)
    assert_kept_stream_rules(events, driver)
    return events


def json_lines(*messages: Any) -> list[bytes]:
    """Messages as the stdout lines of a harness (one JSON document each)."""
    return [json.dumps(message).encode() for message in messages]


def assert_input_rides_on_stdin(command: Command, text: str) -> None:
    """The turn's input reaches the harness whole on stdin, never in argv, and no argv
    element comes near the kernel's limit for one argument."""
    assert command.stdin == text.encode()
    assert text not in command.argv
    assert all(len(arg.encode()) < ARG_MAX_STRLEN for arg in command.argv)


def offered_session_fields(harness_id: str, scenario: str) -> dict[str, Any]:
    """Request fields for replaying a recording: input ``q``, offering the session the
    recorded turn offered (none for a name that is not a recorded scenario)."""
    return {"input": "q", "resume_session": meta(harness_id, scenario).get("resume_session")}


def adapter_command_fields(harness_id: str, scenario: str) -> dict[str, Any]:
    """Request fields for replaying a recording as it was made: its stdin and offered
    session and, when it was recorded with this adapter's command, the adapter's provider
    for the fake server (a base URL and a model)."""
    recorded = meta(harness_id, scenario)
    fields: dict[str, Any] = {
        "input": recorded.get("stdin", "q"),
        "resume_session": recorded.get("resume_session"),
    }
    if str(recorded.get("command_source", "")).startswith("adapter"):
        fields.update(base_url="http://127.0.0.1:1/v1", model="fake-model")
    return fields


#: The recorded turn of every harness that offers a session the harness never issued.
STALE_SESSION_SCENARIO = "badresume"


@dataclass(frozen=True)
class RecordedHarness:
    """One harness's recorded streams and how to replay them, with the facts about the
    harness that the shared tests of ``test_every_adapter.py`` need: declared in the
    harness's own test file."""

    adapter: Adapter
    request_fields: Callable[[str, str], dict[str, Any]]
    """``(harness_id, scenario)`` → the ``TurnRequest`` fields the scenario is replayed with
    (a name that is no recorded scenario stands for a made-up turn)."""
    session: str
    """A session id the harness issued in its recordings."""
    carries: tuple[Mapping[str, Any], ...] = ({},)
    """What earlier turns of a run may have left in ``carry`` (sane or not)."""

    @property
    def harness_id(self) -> str:
        return self.adapter.HARNESS_ID

    def scenarios(self) -> list[str]:
        return scenarios(self.harness_id)

    def request_for(self, scenario: str, **changes: Any) -> TurnRequest:
        return TurnRequest(**{**self.request_fields(self.harness_id, scenario), **changes})

    def recorded_exit(self, scenario: str) -> ExitInfo:
        return exit_info(self.harness_id, scenario)

    @property
    def stale_session(self) -> str:
        """The session offered in the ``badresume`` recording (every harness has one): an id
        the harness never issued. That recording's stderr and exit say how the CLI refuses it."""
        stale: str = meta(self.harness_id, STALE_SESSION_SCENARIO)["resume_session"]
        return stale

    def run(
        self, scenario: str, exit: ExitInfo | None = None, **changes: Any
    ) -> tuple[list[Event], StreamDriver]:
        """Replay a recorded scenario with the request it was recorded with (``changes``
        applied) and its recorded end (or ``exit``)."""
        return replay(
            self.adapter,
            self.request_for(scenario, **changes),
            stdout_bytes(self.harness_id, scenario),
            exit if exit is not None else self.recorded_exit(scenario),
        )

    def messages(self) -> list[dict[str, Any]]:
        """Every JSON object the harness wrote in its recordings, in order."""
        return [
            json.loads(line)
            for scenario in self.scenarios()
            for line in stdout_lines(self.harness_id, scenario)
            if line.startswith(b"{")
        ]


def json_values() -> Any:
    """A hypothesis strategy for arbitrary JSON values (nested a little)."""
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**40), max_value=2**40)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def mutated(message: dict[str, Any]) -> Any:
    """A hypothesis strategy: a real message with some values (top level or one level
    down) replaced by arbitrary JSON, or some keys removed."""
    from hypothesis import strategies as st

    keys = sorted(message)

    @st.composite
    def build(draw: Any) -> dict[str, Any]:
        out = json.loads(json.dumps(message))
        for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
            if draw(st.booleans()):
                out.pop(key, None)
            elif isinstance(out.get(key), dict) and out[key] and draw(st.booleans()):
                inner = sorted(out[key])
                out[key][draw(st.sampled_from(inner))] = draw(json_values())
            else:
                out[key] = draw(json_values())
        return out

    return build()
