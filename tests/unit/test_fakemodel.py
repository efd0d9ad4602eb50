"""The fake model server, spoken to with urllib: SSE shapes, scenarios, markers, the log."""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.fakemodel` from the repo

from tests.fakemodel import (
    RETRY_AFTER_S,
    TEXT_ANSWER,
    TOOL_COMMAND,
    TOOL_FINAL_PREFIX,
    TRUNCATED_TEXT,
    USAGE,
    FakeModelServer,
)
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeModelServer) -> FakeModelServer:
    server.reset()
    return server


def post(
    fake: FakeModelServer, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        fake.url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def sse_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per SSE frame."""
    out: list[tuple[str | None, Any]] = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        name, data = None, []
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        payload = "\n".join(data)
        out.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return out


# -- request bodies shaped like the CLIs'
def anthropic(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "stream": True,
        "system": "SYS-PROMPT",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "tools": [
            {
                "name": "Bash",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "command": {"type": "string"},
                        "description": {"type": "string"},
                    },
                },
            }
        ],
        **extra,
    }


def responses(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-5.5",
        "stream": True,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "DEV-PROMPT"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "exec_command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            }
        ],
        **extra,
    }


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "SYS-PROMPT"},
            {"role": "user", "content": text},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                },
            }
        ],
        **extra,
    }


def gemini(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "systemInstruction": {"parts": [{"text": "SYS-PROMPT"}]},
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "run_shell_command",
                        "parametersJsonSchema": {
                            "type": "object",
                            "properties": {"command": {"type": "string"}},
                        },
                    }
                ]
            }
        ],
        **extra,
    }


GEMINI_STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"


def test_anthropic_stream_has_the_messages_event_sequence(fake: FakeModelServer) -> None:
    status, headers, raw = post(fake, "/v1/messages?beta=true", anthropic("hi"))
    events = sse_events(raw)

    assert status == 200 and headers["content-type"] == "text/event-stream"
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names[-2] == "message_delta"
    assert all(name == data["type"] for name, data in events)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == TEXT_ANSWER
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"]["output_tokens"] == USAGE.output_tokens
    assert events[0][1]["message"]["usage"]["cache_read_input_tokens"] == USAGE.cached_input_tokens


def test_anthropic_tool_scenario_calls_bash_then_answers_with_the_result(
    fake: FakeModelServer,
) -> None:
    _, _, raw = post(fake, "/v1/messages", anthropic("[scenario:tool] run it"))
    events = sse_events(raw)
    block = next(d for n, d in events if n == "content_block_start")["content_block"]
    args = json.loads(
        next(d for n, d in events if n == "content_block_delta")["delta"]["partial_json"]
    )
    assert block["type"] == "tool_use" and block["name"] == "Bash"
    assert args["command"] == TOOL_COMMAND
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"

    follow_up = anthropic("[scenario:tool] run it")
    follow_up["messages"] += [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": block["id"], "name": "Bash", "input": args}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": block["id"], "content": "tool-ran-42\n"}
            ],
        },
    ]
    _, _, raw = post(fake, "/v1/messages", follow_up)
    text = "".join(d["delta"]["text"] for n, d in sse_events(raw) if n == "content_block_delta")
    assert text == TOOL_FINAL_PREFIX + "tool-ran-42"


def test_anthropic_non_streaming_and_count_tokens_answer_json(fake: FakeModelServer) -> None:
    status, _, raw = post(fake, "/v1/messages", anthropic("title please", stream=False))
    message = json.loads(raw)
    assert status == 200 and message["content"][0]["text"] == TEXT_ANSWER
    status, _, raw = post(fake, "/v1/messages/count_tokens", anthropic("x", stream=False))
    assert status == 200 and json.loads(raw) == {"input_tokens": USAGE.input_tokens}
    assert [r.kind for r in fake.requests] == ["turn", "count_tokens"]


def test_responses_stream_completes_with_usage_and_model(fake: FakeModelServer) -> None:
    fake.answer_model = "fake-model-answered"
    _, _, raw = post(fake, "/v1/responses", responses("hi"))
    events = sse_events(raw)

    names = [n for n, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert "response.output_item.done" in names
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == TEXT_ANSWER
    final = events[-1][1]["response"]
    assert final["model"] == "fake-model-answered"
    assert final["usage"]["input_tokens"] == USAGE.input_tokens
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == USAGE.cached_input_tokens
    assert fake.requests[0].requested_model == "gpt-5.5"
    assert fake.requests[0].answered_model == "fake-model-answered"


def test_responses_tool_scenario_calls_the_offered_shell_function(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, "/v1/responses", responses("[scenario:tool] go"))
    item = next(d for n, d in sse_events(raw) if n == "response.output_item.done")["item"]
    assert item["type"] == "function_call" and item["name"] == "exec_command"
    assert json.loads(item["arguments"]) == {"cmd": TOOL_COMMAND}

    follow_up = responses("[scenario:tool] go")
    follow_up["input"] += [
        {
            "type": "function_call",
            "call_id": item["call_id"],
            "name": "exec_command",
            "arguments": item["arguments"],
        },
        {"type": "function_call_output", "call_id": item["call_id"], "output": "tool-ran-42"},
    ]
    _, _, raw = post(fake, "/v1/responses", follow_up)
    text = "".join(d["delta"] for n, d in sse_events(raw) if n == "response.output_text.delta")
    assert text == TOOL_FINAL_PREFIX + "tool-ran-42"


def test_chat_stream_ends_with_usage_chunk_and_done(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, "/v1/chat/completions", chat("hi"))
    events = [data for _, data in sse_events(raw)]

    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["prompt_tokens"] == USAGE.input_tokens
    assert usage_chunk["usage"]["completion_tokens"] == USAGE.output_tokens
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert text == TEXT_ANSWER


def test_chat_stream_omits_usage_chunk_when_not_asked(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, "/v1/chat/completions", chat("hi", stream_options=None))
    events = [data for _, data in sse_events(raw)]
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])


def test_chat_tool_scenario_streams_a_bash_tool_call(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, "/v1/chat/completions", chat("[scenario:tool] go"))
    events = [data for _, data in sse_events(raw)][:-2]
    calls = [c for e in events for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "bash"
    args = json.loads("".join(c["function"]["arguments"] for c in calls))
    assert args == {"command": TOOL_COMMAND}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"

    follow_up = chat("[scenario:tool] go")
    follow_up["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps(args)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "tool-ran-42\n"},
    ]
    _, _, raw = post(fake, "/v1/chat/completions", follow_up)
    events = [data for _, data in sse_events(raw)][:-2]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == TOOL_FINAL_PREFIX + "tool-ran-42"


def test_chat_tool_scenario_answers_text_when_no_tool_is_offered(fake: FakeModelServer) -> None:
    body = chat("[scenario:tool] make a title")
    del body["tools"]
    _, _, raw = post(fake, "/v1/chat/completions", body)
    events = [data for _, data in sse_events(raw)][:-2]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == TEXT_ANSWER


def test_gemini_stream_chunks_carry_usage_and_model_version(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, GEMINI_STREAM, gemini("hi"))
    chunks = [data for _, data in sse_events(raw)]

    text = "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks)
    assert text == TEXT_ANSWER
    assert all(c["modelVersion"] == "gemini-2.5-flash" for c in chunks)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == USAGE.input_tokens
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == USAGE.output_tokens


def test_gemini_tool_scenario_calls_run_shell_command(fake: FakeModelServer) -> None:
    _, _, raw = post(fake, GEMINI_STREAM, gemini("[scenario:tool] go"))
    part = sse_events(raw)[0][1]["candidates"][0]["content"]["parts"][0]
    assert part["functionCall"] == {"name": "run_shell_command", "args": {"command": TOOL_COMMAND}}

    follow_up = gemini("[scenario:tool] go")
    follow_up["contents"] += [
        {"role": "model", "parts": [part]},
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "run_shell_command",
                        "response": {"output": "tool-ran-42"},
                    }
                }
            ],
        },
    ]
    _, _, raw = post(fake, GEMINI_STREAM, follow_up)
    text = "".join(c["candidates"][0]["content"]["parts"][0]["text"] for _, c in sse_events(raw))
    assert text == TOOL_FINAL_PREFIX + "tool-ran-42"


def test_gemini_generate_content_fills_a_json_schema(fake: FakeModelServer) -> None:
    body = gemini(
        "who speaks next?",
        generationConfig={
            "responseMimeType": "application/json",
            "responseJsonSchema": {
                "type": "object",
                "properties": {
                    "reasoning": {"type": "string"},
                    "next_speaker": {"type": "string", "enum": ["model", "user"]},
                },
            },
        },
    )
    status, _, raw = post(fake, "/v1beta/models/gemini-2.5-flash:generateContent", body)
    answer = json.loads(json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"])
    assert status == 200 and answer == {"reasoning": "fake", "next_speaker": "user"}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/messages", anthropic, 429, "rate_limit_error"),
        ("/v1/responses", responses, 429, "rate_limit_exceeded"),
        ("/v1/chat/completions", chat, 429, "rate_limit_exceeded"),
        (GEMINI_STREAM, gemini, 429, "RESOURCE_EXHAUSTED"),
    ],
)
def test_http_429_has_retry_after_and_vendor_body(
    fake: FakeModelServer, path: str, body: Any, status: int, needle: str
) -> None:
    got, headers, raw = post(fake, path, body("[scenario:http-429] hi"))
    assert got == status
    assert headers["retry-after"] == str(RETRY_AFTER_S)
    assert needle in raw.decode()
    assert fake.requests[-1].status == 429


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/messages", anthropic, 400, "credit balance is too low"),
        ("/v1/responses", responses, 429, "insufficient_quota"),
        ("/v1/chat/completions", chat, 429, "insufficient_quota"),
        (GEMINI_STREAM, gemini, 429, "exceeded your current quota"),
    ],
)
def test_quota_scenario_returns_the_vendor_quota_error(
    fake: FakeModelServer, path: str, body: Any, status: int, needle: str
) -> None:
    fake.set_scenario("quota")
    got, headers, raw = post(fake, path, body("hi"))
    assert got == status
    assert needle in raw.decode()
    assert "retry-after" not in headers


@pytest.mark.parametrize(("scenario", "status"), [("http-401", 401), ("http-500", 500)])
@pytest.mark.parametrize(
    "path_body",
    [
        ("/v1/messages", anthropic),
        ("/v1/responses", responses),
        ("/v1/chat/completions", chat),
        (GEMINI_STREAM, gemini),
    ],
)
def test_error_scenarios_return_their_status_with_a_json_error(
    fake: FakeModelServer, scenario: str, status: int, path_body: tuple[str, Any]
) -> None:
    path, body = path_body
    got, _, raw = post(fake, path, body(f"[scenario:{scenario}] hi"))
    assert got == status
    assert "error" in json.loads(raw)


def test_slow_scenario_spaces_frames_by_the_delay(fake: FakeModelServer) -> None:
    started = time.monotonic()
    _, _, raw = post(fake, "/v1/chat/completions", chat("[scenario:slow][delay:0.2] hi"))
    elapsed = time.monotonic() - started
    frames = sse_events(raw)
    text = "".join(d["choices"][0]["delta"].get("content", "") for _, d in frames[:-2])
    assert text == TEXT_ANSWER
    assert elapsed >= 0.2 * (len(frames) - 1) * 0.9


def test_truncated_scenario_drops_the_connection_mid_stream(fake: FakeModelServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    conn.request(
        "POST",
        "/v1/messages",
        json.dumps(anthropic("[scenario:truncated] hi")),
        {"content-type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()
    partial = info.value.partial.decode()
    assert TRUNCATED_TEXT[: len(TRUNCATED_TEXT) // 2] in partial
    assert "message_stop" not in partial
    conn.close()


def test_marker_applies_only_to_the_current_turn(fake: FakeModelServer) -> None:
    resumed = chat("now just answer")
    resumed["messages"][1:1] = [
        {"role": "user", "content": "[scenario:http-500] earlier turn"},
        {"role": "assistant", "content": "earlier answer"},
    ]
    status, _, _ = post(fake, "/v1/chat/completions", resumed)
    assert status == 200
    assert fake.requests[-1].scenario == "text"


def test_request_log_redacts_auth_and_keeps_the_body(fake: FakeModelServer) -> None:
    post(
        fake,
        "/v1/messages?beta=true",
        anthropic("hi"),
        {"x-api-key": "sk-secret", "authorization": "Bearer sk-secret"},
    )
    post(fake, GEMINI_STREAM, gemini("hi"), {"x-goog-api-key": "sk-secret"})
    first, second = fake.requests

    assert first.path == "/v1/messages" and first.query == {"beta": ["true"]}
    assert first.headers["x-api-key"] == "<redacted>"
    assert first.headers["authorization"] == "<redacted>"
    assert second.headers["x-goog-api-key"] == "<redacted>"
    assert "sk-secret" not in json.dumps([r.as_dict() for r in fake.requests])
    assert first.system_text() == "SYS-PROMPT" and first.user_texts() == ["hi"]
    assert second.system_text() == "SYS-PROMPT" and second.requested_model == "gemini-2.5-flash"
    assert first.body["model"] == "claude-sonnet-4-5"


def test_responses_developer_item_counts_as_system_text(fake: FakeModelServer) -> None:
    post(fake, "/v1/responses", responses("hi"))
    assert fake.requests[0].system_text() == "DEV-PROMPT"


def test_unknown_route_is_logged_and_answered_404(fake: FakeModelServer) -> None:
    status, _, raw = post(fake, "/v1/nothing-here", {"a": 1})
    assert status == 404 and "error" in json.loads(raw)
    assert fake.requests[0].kind == "unknown" and fake.requests[0].body == {"a": 1}


def test_set_scenario_refuses_an_unknown_name(fake: FakeModelServer) -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        fake.set_scenario("nope")


def test_module_runs_as_a_server_process(tmp_path: Path) -> None:
    import subprocess

    log = tmp_path / "requests.ndjson"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakemodel", "--scenario", "tool", "--log", str(log)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        req = urllib.request.Request(
            url + "/v1/chat/completions", data=json.dumps(chat("hi")).encode()
        )
        raw = urllib.request.urlopen(req, timeout=10).read()
        assert b'"name":"bash"' in raw.replace(b" ", b"")
        logged = wait_for(
            lambda: log.exists() and log.read_text().endswith("\n") and log.read_text(),
            timeout=5,
            what="the request in the server's log",
        )
        entry = json.loads(logged.splitlines()[0])
        assert entry["path"] == "/v1/chat/completions" and entry["scenario"] == "tool"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
