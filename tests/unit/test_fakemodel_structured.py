"""The fake model's ``structured`` scenarios: it finds the images a request carries in each API's
form, says whether the request offered the schema, and answers with valid or invalid JSON (as
the input of Claude Code's StructuredOutput tool where that tool is offered)."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.fakemodel` from the repo

from tests.fakemodel import FakeModelServer
from tests.fakemodel.scenarios import STRUCTURED_SCHEMA, STRUCTURED_TOOL, images_in
from tests.images import gif, png

IMAGE = png()
B64 = base64.b64encode(IMAGE).decode()
SHA = hashlib.sha256(IMAGE).hexdigest()
PROMPT = "[scenario:structured] What colour is it?"
SYSTEM = "Answer with JSON valid against: " + json.dumps(STRUCTURED_SCHEMA)


def anthropic(prompt: str = PROMPT, **extra: Any) -> dict[str, Any]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    content = [image, {"type": "text", "text": prompt}]
    return {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def responses(prompt: str = PROMPT) -> dict[str, Any]:
    content = [
        {"type": "input_text", "text": prompt},
        {"type": "input_image", "image_url": f"data:image/png;base64,{B64}"},
    ]
    return {
        "model": "m",
        "instructions": SYSTEM,
        "input": [{"type": "message", "role": "user", "content": content}],
    }


def chat(prompt: str = PROMPT) -> dict[str, Any]:
    content = [
        {"type": "text", "text": prompt},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
    ]
    return {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
    }


def gemini(prompt: str = PROMPT) -> dict[str, Any]:
    parts = [{"text": prompt}, {"inlineData": {"mimeType": "image/png", "data": B64}}]
    return {
        "contents": [{"role": "user", "parts": parts}],
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
    }


def test_images_are_found_in_every_api_form_each_once() -> None:
    for body in (anthropic(), responses(), chat(), gemini()):
        assert images_in(body) == [IMAGE]
    twice = {"a": chat(), "b": gemini(), "c": base64.b64encode(gif()).decode()}
    assert images_in(twice) == [IMAGE]
    assert images_in({"text": "data:image/png;base64,not base64!"}) == []
    assert images_in({"mimeType": "text/plain", "data": B64}) == []


@pytest.fixture(scope="module")
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as fake:
        yield fake


def post(fake: FakeModelServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        fake.url + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def answer_text(api: str, reply: dict[str, Any]) -> str:
    if api == "anthropic":
        return str(reply["content"][0]["text"])
    if api == "responses":
        return str(reply["output"][0]["content"][0]["text"])
    if api == "chat":
        return str(reply["choices"][0]["message"]["content"])
    return str(reply["candidates"][0]["content"]["parts"][0]["text"])


ROUTES = {
    "anthropic": ("/v1/messages", anthropic),
    "responses": ("/v1/responses", responses),
    "chat": ("/v1/chat/completions", chat),
    "gemini": ("/v1beta/models/m:generateContent", gemini),
}


@pytest.mark.parametrize("api", sorted(ROUTES))
def test_the_answer_says_which_images_it_saw_and_whether_the_schema_was_offered(
    server: FakeModelServer, api: str
) -> None:
    path, body = ROUTES[api]
    valid = json.loads(answer_text(api, post(server, path, body())))
    assert valid == {"verdict": "ok", "images": [SHA], "schema_offered": api != "anthropic"}
    invalid = body(PROMPT.replace("structured", "structured-invalid"))
    broken = json.loads(answer_text(api, post(server, path, invalid)))
    assert broken["verdict"] == 42


def test_claude_codes_structured_output_tool_is_called_with_the_answer(
    server: FakeModelServer,
) -> None:
    tool = {"name": STRUCTURED_TOOL, "input_schema": STRUCTURED_SCHEMA}
    reply = post(server, "/v1/messages", anthropic(tools=[tool]))
    [call] = [block for block in reply["content"] if block["type"] == "tool_use"]
    assert call["name"] == STRUCTURED_TOOL
    assert call["input"] == {"verdict": "ok", "images": [SHA], "schema_offered": True}
