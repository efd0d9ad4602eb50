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

import hashlib
from pathlib import Path

import pytest

import adapters
from adapters.events import SessionError, TurnComplete
from adapters.protocol import Attachment, TurnRequest
from tests.conformance.conftest import LiveTurn, RunLiveTurn
from tests.fakemodel.scenarios import STRUCTURED_SCHEMA, images_in, schema_offered
from tests.images import png
from worker.turn import structured

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
