"""Attachments in and a validated result out, with the five real CLIs against the fake model.

Each turn attaches a PNG (written where the worker writes it, ``.attachments/turn-1/``) and
an output schema (the fake model's :data:`STRUCTURED_SCHEMA`). The fake model answers with
the SHA-256 of every image its request carried and whether the request offered the schema,
so a ``structured`` result that validates says both: the image's bytes reached the model
through the harness's own image input, and the schema reached it through the harness's
schema option or its system prompt. The request log is checked too. The answer is validated
as the worker does it (:func:`worker.turn.structured.check`, called by the turn before its
terminal is written); an answer that breaks the schema ends the turn ``invalid-output``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import fakeredis
import pytest

import adapters
from adapters.events import Event, SessionError, TurnComplete
from adapters.protocol import Attachment, TurnRequest
from adapters.stream import StreamDriver
from sandbox.base import ExecSpec, Placement
from sandbox.local import LocalSandbox
from tests.conformance.conftest import (
    DEFAULT_SECRETS,
    EXIT_GRACE_S,
    LiveTurn,
    RunLiveTurn,
    _RecordingPublishing,
    _resolve,
    base_url_for,
)
from tests.fakemodel import FakeModelServer
from tests.fakemodel.scenarios import STRUCTURED_SCHEMA, images_in, schema_offered
from tests.images import png
from worker.observe.masking import Masker
from worker.options.policy import fit_request
from worker.permissions import requests as permissions
from worker.store.keys import Keys
from worker.turn import attempt, structured

HARNESSES = ("claude-code", "codex", "gemini", "opencode", "pi")
#: The model each CLI is asked for (opencode and pi need one to use a base URL).
MODELS = {
    "codex": "gpt-5.5",
    "gemini": "gemini-2.5-flash",
    "opencode": "fake-model",
    "pi": "fake-model",
}


IMAGE = png()


def attach(workspace: str, name: str, data: bytes, media_type: str) -> Attachment:
    """Write an attachment where the worker writes it; the request's value for it."""
    relative = f".attachments/turn-1/{name}"
    path = Path(workspace) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    image = media_type.startswith("image/")
    return Attachment(relative, media_type, len(data), data if image else b"")


def structured_turn(
    harness: str, scenario: str, run_live_turn: RunLiveTurn, live_placement: object
) -> LiveTurn:
    placement = live_placement()  # type: ignore[operator]
    image = attach(placement.workspace, "red.png", IMAGE, "image/png")
    request = TurnRequest(
        input=f"[scenario:{scenario}] What colour is the attached picture?",
        model=MODELS.get(harness),
        attachments=(image,),
        output_schema=STRUCTURED_SCHEMA,
    )
    return run_live_turn(harness, request, placement=placement)


@pytest.mark.parametrize("harness", HARNESSES)
def test_the_image_reaches_the_model_and_the_answer_is_structured(
    harness: str, run_live_turn: RunLiveTurn, live_placement: object
) -> None:
    turn = structured_turn(harness, "structured", run_live_turn, live_placement)
    checked = structured.check(turn.complete, STRUCTURED_SCHEMA)
    assert isinstance(checked, TurnComplete), f"{checked!r}\n{turn.describe()}"
    # Where the image landed, per API: Anthropic image blocks, Responses input_image and Chat
    # image_url data URLs, Gemini inlineData; in the request that offered the schema (not
    # opencode's title call, which may carry the image too).
    carried = [
        r for r in turn.model_requests() if IMAGE in images_in(r.body) and schema_offered(r.body)
    ]
    assert carried, f"no image in the model's requests with the schema: {turn.describe()}"
    assert checked.structured == {
        "verdict": "ok",
        "images": [hashlib.sha256(IMAGE).hexdigest()],
        "schema_offered": True,
    }
    capabilities = adapters.get(harness).CAPABILITIES
    assert capabilities.attachments == "images"


@pytest.mark.parametrize("harness", HARNESSES)
def test_an_answer_that_breaks_the_schema_is_invalid_output(
    harness: str, run_live_turn: RunLiveTurn, live_placement: object
) -> None:
    turn = structured_turn(harness, "structured-invalid", run_live_turn, live_placement)
    assert isinstance(turn.terminal, TurnComplete), turn.describe()
    checked = structured.check(turn.terminal, STRUCTURED_SCHEMA)
    assert isinstance(checked, SessionError), f"{checked!r}\n{turn.describe()}"
    assert checked.reason == "invalid-output"
    assert checked.retryable is False
    assert "output schema" in checked.error


ASK_MODES = ("claude-code", "codex", "gemini", "opencode", "pi")
"""Every ask mode carries the images and the schema too: claude-code's stream-json control
channel, codex app-server's turn/start, the ACP session/prompt of gemini and opencode, pi's
RPC prompt command."""


@pytest.fixture
def run_asked_turn(
    request: pytest.FixtureRequest,
    fake_model: FakeModelServer,
    live_sandbox: LocalSandbox,
) -> Callable[[str, TurnRequest, Placement], list[Event]]:
    """One ``--posture ask`` turn through the worker's read loop and its permission gate,
    every request allowed (the structured scenarios ask for nothing but Claude Code's
    StructuredOutput call)."""

    def run(harness: str, turn_request: TurnRequest, placement: Placement) -> list[Event]:
        adapter = adapters.get(harness)
        granted = dict(DEFAULT_SECRETS.get(harness, {}))
        fitted = fit_request(
            dataclasses.replace(
                turn_request,
                posture="ask",
                workspace=placement.workspace,
                home=placement.home,
                base_url=base_url_for(harness, fake_model),
                granted_env=frozenset(granted),
            ),
            adapter.CAPABILITIES,
        )
        command = adapter.build_command(fitted)
        spec = ExecSpec(
            argv=_resolve(command.argv, lambda: request.getfixturevalue("clis")),
            stdin=command.stdin,
            env=dict(command.env),
            files=dict(command.files),
            cwd=command.cwd,
            keep_stdin=command.keep_stdin,
        )
        out = _RecordingPublishing(placement.run_id)
        client = out.publisher._redis
        keys = Keys("conformance")
        gate = permissions.Gate(client, keys, placement.run_id, 1, timeout_s=60.0, masker=Masker())
        stop = threading.Event()

        def allow_all() -> None:
            while not stop.is_set():
                for pending in permissions.pending(client, keys, placement.run_id):
                    permissions.answer(
                        client, keys, placement.run_id, pending["request_id"],
                        allow=True, always=False, by="live-test", message=None,
                    )  # fmt: skip
                time.sleep(0.05)

        thread = threading.Thread(target=allow_all, daemon=True)
        thread.start()
        driver = StreamDriver(adapter, fitted)
        limits = attempt.Limits(
            deadline=time.monotonic() + 120, idle_s=120, exit_grace_s=EXIT_GRACE_S,
            kill_grace_s=1.0,
        )  # fmt: skip
        process = live_sandbox.start(placement, spec, granted)
        gate.attach(adapter, driver.state, process)
        try:
            outcome = attempt.drive(process, driver, out, limits, lambda: None, gate)
        finally:
            stop.set()
            thread.join(5)
        return [*out.events, outcome.terminal]

    return run


@pytest.fixture(autouse=True)
def _lua_in_fakeredis() -> None:
    # The gate's answer script runs in fakeredis's Lua (lupa), as in Redis in a worker.
    fakeredis.FakeRedis(decode_responses=True).register_script("return 1")()


@pytest.mark.parametrize("harness", ASK_MODES)
def test_the_ask_mode_carries_the_image_and_the_schema_too(
    harness: str,
    run_asked_turn: Callable[[str, TurnRequest, Placement], list[Event]],
    live_placement: Callable[[], Placement],
    fake_model: FakeModelServer,
) -> None:
    placement = live_placement()
    image = attach(placement.workspace, "red.png", IMAGE, "image/png")
    request = TurnRequest(
        input="[scenario:structured] What colour is the attached picture?",
        model=MODELS.get(harness),
        attachments=(image,),
        output_schema=STRUCTURED_SCHEMA,
    )
    events = run_asked_turn(harness, request, placement)
    checked = structured.check(events[-1], STRUCTURED_SCHEMA)
    assert isinstance(checked, TurnComplete), f"{checked!r}\n{events}"
    assert checked.structured == {
        "verdict": "ok",
        "images": [hashlib.sha256(IMAGE).hexdigest()],
        "schema_offered": True,
    }
    assert any(
        IMAGE in images_in(r.body) and schema_offered(r.body)
        for r in fake_model.requests
        if r.kind == "turn"
    )
