"""Each adapter's channel for a turn's images and its output schema, as argv, stdin, env and
config files (the live proof that each channel reaches the model is
tests/conformance/test_attachments_structured_live.py), and the worker's fitting of both to
the harnesses without a channel (worker.options.policy.fit_request)."""

from __future__ import annotations

import base64
import dataclasses
import json
import tomllib
from typing import Any

import pytest

import adapters
from adapters import (
    acp,
    claude_code,
    claude_control,
    codex,
    codex_app_server,
    gemini,
    gemini_acp,
    opencode,
    opencode_acp,
    pi,
    pi_rpc,
    stdio_json,
)
from adapters.protocol import Attachment, TurnRequest
from worker.options.policy import attachment_warning, fit_request, schema_instruction

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
IMAGE = Attachment(".attachments/turn-1/red.png", "image/png", len(PNG), PNG)
NOTES = Attachment(".attachments/turn-1/notes.txt", "application/octet-stream", 5)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
BASE = TurnRequest(
    input="look",
    workspace="/workspace",
    home="/workspace/.home",
    model="m1",
    base_url="http://127.0.0.1:9/v1",
    granted_env=frozenset({"OPENAI_API_KEY"}),
)
WITH = dataclasses.replace(BASE, attachments=(IMAGE, NOTES), output_schema=SCHEMA)


def test_claude_code_sends_images_as_stream_json_blocks_and_the_schema_by_its_option() -> None:
    plain = claude_code.build_command(BASE)
    assert "--input-format" not in plain.argv and plain.stdin == b"look"
    command = claude_code.build_command(WITH)
    argv = list(command.argv)
    assert argv[argv.index("--input-format") + 1] == "stream-json"
    assert json.loads(argv[argv.index("--json-schema") + 1]) == SCHEMA
    assert command.stdin is not None and command.stdin.endswith(b"\n")
    line = json.loads(command.stdin)
    assert line["type"] == "user"
    image, text = line["message"]["content"]
    assert image == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(PNG).decode(),
        },
    }
    assert text == {"type": "text", "text": "look"}  # the other file is named in the input


def test_claude_code_ask_mode_sends_the_same_message_and_reports_structured_output() -> None:
    command = claude_control.build_command(dataclasses.replace(WITH, posture="ask"))
    assert command.keep_stdin and command.stdin == claude_code.user_message(WITH)
    state = claude_code.new_state(WITH)
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "Done.",
        "session_id": "s",
        "structured_output": {"n": 3},
    }
    done = claude_code.map_message(result, state)[-1]
    assert done.type == "turn-complete" and done.structured == {"n": 3}  # type: ignore[union-attr]


def test_codex_attaches_each_image_by_path_and_writes_the_schema_file() -> None:
    assert not any(a.startswith("--image") for a in codex.build_command(BASE).argv)
    command = codex.build_command(WITH)
    argv = list(command.argv)
    assert "--image=/workspace/.attachments/turn-1/red.png" in argv
    assert not any("notes.txt" in a for a in argv)
    schema_path = argv[argv.index("--output-schema") + 1]
    assert schema_path == "/workspace/.home/.harness/codex-output-schema.json"
    assert json.loads(command.files[schema_path]) == SCHEMA
    assert argv[-1] == "-"  # the prompt still comes from stdin
    tomllib.loads(command.files["/workspace/.home/.codex/config.toml"])


def test_gemini_references_each_image_in_its_prompt() -> None:
    assert arg_after(gemini.build_command(BASE).argv, "--prompt") == ""
    argv = gemini.build_command(WITH).argv
    assert arg_after(argv, "--prompt") == "@.attachments/turn-1/red.png"


def arg_after(argv: tuple[str, ...], flag: str) -> str:
    return argv[list(argv).index(flag) + 1]


def test_opencode_attaches_each_image_as_a_file_of_a_model_that_takes_images() -> None:
    plain = opencode.build_command(BASE)
    assert not any(a.startswith("--file") for a in plain.argv)
    command = opencode.build_command(WITH)
    assert "--file=/workspace/.attachments/turn-1/red.png" in command.argv
    config = json.loads(command.files["/workspace/.home/.config/opencode/opencode.json"])
    model = config["provider"][opencode.PROVIDER]["models"]["m1"]
    assert model["attachment"] is True
    assert model["modalities"]["input"] == ["text", "image"]
    plain_config = json.loads(plain.files["/workspace/.home/.config/opencode/opencode.json"])
    assert "modalities" not in plain_config["provider"][opencode.PROVIDER]["models"]["m1"]


def test_pi_names_each_image_as_an_at_file_of_a_model_that_takes_images() -> None:
    command = pi.build_command(WITH)
    assert command.argv[-1] == "@/workspace/.attachments/turn-1/red.png"
    models = json.loads(command.files["/workspace/.home/.pi/agent/models.json"])
    assert models["providers"][pi.PROVIDER]["models"][0]["input"] == ["text", "image"]
    plain = json.loads(pi.build_command(BASE).files["/workspace/.home/.pi/agent/models.json"])
    assert "input" not in plain["providers"][pi.PROVIDER]["models"][0]


def test_stdio_json_lists_the_files_in_harness_attachments() -> None:
    request = dataclasses.replace(WITH, executable="/bin/demo")
    assert (
        "HARNESS_ATTACHMENTS"
        not in stdio_json.build_command(dataclasses.replace(BASE, executable="/bin/demo")).env
    )
    listed = json.loads(stdio_json.build_command(request).env["HARNESS_ATTACHMENTS"])
    assert listed == [
        {"path": "/workspace/.attachments/turn-1/red.png", "media_type": "image/png", "size": 24},
        {
            "path": "/workspace/.attachments/turn-1/notes.txt",
            "media_type": "application/octet-stream",
            "size": 5,
        },
    ]
    asking = stdio_json.build_command(dataclasses.replace(request, posture="ask"))
    assert "HARNESS_ATTACHMENTS" in asking.env


@pytest.mark.parametrize("harness", adapters.HARNESS_IDS)
def test_every_attachment_is_named_in_the_input_and_the_schema_reaches_the_harness(
    harness: str,
) -> None:
    caps = adapters.get(harness).CAPABILITIES
    fitted = fit_request(WITH, caps)
    assert "look\n\nAttached files (paths relative to the working directory):\n" in fitted.input
    assert "- .attachments/turn-1/red.png (image/png, 24 bytes)" in fitted.input
    assert "- .attachments/turn-1/notes.txt (application/octet-stream, 5 bytes)" in fitted.input
    assert fitted.output_schema == SCHEMA
    instruction = schema_instruction(SCHEMA)
    if caps.structured_output == "native":
        assert fitted.system_prompt is None and instruction not in fitted.input
    elif caps.system_prompt:
        assert fitted.system_prompt == instruction
    else:  # no system-prompt channel: the instruction rides at the head of the input
        assert fitted.system_prompt is None and fitted.input.startswith(instruction)


def test_a_system_prompt_keeps_its_place_before_the_schema_instruction() -> None:
    fitted = fit_request(dataclasses.replace(WITH, system_prompt="Be brief."), gemini.CAPABILITIES)
    assert fitted.system_prompt == f"Be brief.\n\n{schema_instruction(SCHEMA)}"


def test_images_reaching_a_harness_only_as_files_are_warned_about() -> None:
    assert attachment_warning(WITH, stdio_json.CAPABILITIES) is not None
    assert "no image input" in (attachment_warning(WITH, stdio_json.CAPABILITIES) or "")
    assert attachment_warning(WITH, pi.CAPABILITIES) is None
    only_files = dataclasses.replace(WITH, attachments=(NOTES,))
    assert attachment_warning(only_files, stdio_json.CAPABILITIES) is None


ASKED = dataclasses.replace(WITH, posture="ask")


def test_codex_app_server_starts_the_turn_with_local_images_and_the_output_schema() -> None:
    state = codex_app_server.new_state(ASKED)
    turn = codex_app_server._turn_start("thread-1", state.channel)
    assert turn == {
        "threadId": "thread-1",
        "input": [
            {"type": "text", "text": "look"},
            {"type": "localImage", "path": "/workspace/.attachments/turn-1/red.png"},
        ],
        "outputSchema": SCHEMA,
    }
    plain = codex_app_server._turn_start("t", codex_app_server.new_state(BASE).channel)
    assert plain == {"threadId": "t", "input": [{"type": "text", "text": "look"}]}


@pytest.mark.parametrize("module", [gemini_acp, opencode_acp], ids=["gemini", "opencode"])
def test_the_acp_prompt_carries_each_image_as_a_content_block(module: Any) -> None:
    state = module.new_state(ASKED)
    state.session_id = "s1"
    acp._prompt(state, state.channel)
    prompt = json.loads(state.outbox[-1])["params"]["prompt"]
    assert prompt == [
        {"type": "image", "mimeType": "image/png", "data": base64.b64encode(PNG).decode()},
        {"type": "text", "text": "look"},
    ]


def test_the_pi_rpc_prompt_command_carries_the_images() -> None:
    command = pi_rpc.build_command(ASKED)
    assert command.stdin is not None
    prompt = json.loads(command.stdin.splitlines()[-1])
    assert prompt["type"] == "prompt" and prompt["message"] == "look"
    assert prompt["images"] == [
        {"type": "image", "data": base64.b64encode(PNG).decode(), "mimeType": "image/png"}
    ]
    plain = json.loads(
        pi_rpc.build_command(dataclasses.replace(BASE, posture="ask")).stdin.splitlines()[-1]
    )  # type: ignore[union-attr]
    assert "images" not in plain
