"""The four wire APIs: reading a request into a :class:`Conversation`, and the bodies, SSE
events and error payloads each vendor really sends.

Each API is an object with ``conversation(body)``, ``stream(...)`` (a list of SSE frames, as
bytes), ``complete(...)`` (a non-streaming JSON body) and ``error(scenario)`` (status, extra
headers, JSON body).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tests.fakemodel.scenarios import (
    RETRY_AFTER_S,
    USAGE,
    Conversation,
    Item,
    shell_arguments,
    text_of,
)


@dataclass(frozen=True)
class Answer:
    """What to answer: text (maybe split into chunks), or one tool call."""

    model: str
    chunks: tuple[str, ...] = ()
    tool_name: str | None = None
    tool_args: dict[str, Any] | None = None
    truncated: bool = False
    tool_namespace: str | None = None
    """The Responses API's namespace of the tool (Codex's MCP tools: ``mcp__SERVER``)."""

    @property
    def text(self) -> str:
        return "".join(self.chunks)


@dataclass(frozen=True)
class ErrorReply:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}\n\n".encode()


# --------------------------------------------------------------------------- Anthropic
class Anthropic:
    name = "anthropic"

    def conversation(self, body: dict[str, Any]) -> Conversation:
        items: list[Item] = []
        system = body.get("system")
        if system:
            items.append(Item("system", "text", text_of(system)))
        for message in body.get("messages") or []:
            role = message.get("role", "user")
            content = message.get("content")
            if isinstance(content, str):
                items.append(Item(role, "text", content))
                continue
            for block in content or []:
                kind = block.get("type")
                if kind == "text":
                    items.append(Item(role, "text", block.get("text", "")))
                elif kind == "tool_use":
                    items.append(Item(role, "tool_call", json.dumps(block.get("input"))))
                elif kind == "tool_result":
                    items.append(Item(role, "tool_result", text_of(block.get("content"))))
        tools = [
            {"name": t.get("name"), "parameters": t.get("input_schema") or {}}
            for t in body.get("tools") or []
        ]
        return Conversation(items, tools)

    @staticmethod
    def _usage(output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": USAGE.uncached_input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": USAGE.cached_input_tokens,
            "output_tokens": output_tokens,
        }

    def _blocks(self, answer: Answer, tool_id: str) -> list[dict[str, Any]]:
        if answer.tool_name:
            return [
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": answer.tool_name,
                    "input": answer.tool_args,
                }
            ]
        return [{"type": "text", "text": answer.text}]

    def stream(self, answer: Answer) -> Iterator[bytes]:
        msg_id, tool_id = _id("msg_"), _id("toolu_")
        yield sse(
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": answer.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": self._usage(1),
                },
            },
            "message_start",
        )
        if answer.tool_name:
            yield sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {
                        "type": "tool_use",
                        "id": tool_id,
                        "name": answer.tool_name,
                        "input": {},
                    },
                },
                "content_block_start",
            )
            yield sse({"type": "ping"}, "ping")
            yield sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(answer.tool_args),
                    },
                },
                "content_block_delta",
            )
            stop_reason = "tool_use"
        else:
            yield sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
            yield sse({"type": "ping"}, "ping")
            for chunk in answer.chunks:
                yield sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": chunk},
                    },
                    "content_block_delta",
                )
            stop_reason = "end_turn"
        if answer.truncated:
            return
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        yield sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": self._usage(USAGE.output_tokens),
            },
            "message_delta",
        )
        yield sse({"type": "message_stop"}, "message_stop")

    def complete(self, answer: Answer) -> dict[str, Any]:
        return {
            "id": _id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": self._blocks(answer, _id("toolu_")),
            "stop_reason": "tool_use" if answer.tool_name else "end_turn",
            "stop_sequence": None,
            "usage": self._usage(USAGE.output_tokens),
        }

    def error(self, scenario: str) -> ErrorReply:
        def body(kind: str, message: str) -> dict[str, Any]:
            return {
                "type": "error",
                "error": {"type": kind, "message": message},
                "request_id": _id("req_"),
            }

        if scenario == "http-429":
            return ErrorReply(
                429,
                {"retry-after": str(RETRY_AFTER_S), "anthropic-ratelimit-requests-remaining": "0"},
                body(
                    "rate_limit_error",
                    "This request would exceed the rate limit for your organization of "
                    "50 requests per minute. Please try again later.",
                ),
            )
        if scenario == "http-401":
            return ErrorReply(401, {}, body("authentication_error", "invalid x-api-key"))
        if scenario == "quota":
            return ErrorReply(
                400,
                {},
                body(
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API. Please go "
                    "to Plans & Billing to upgrade or purchase credits.",
                ),
            )
        return ErrorReply(500, {}, body("api_error", "Internal server error"))


# --------------------------------------------------------------------------- OpenAI errors
def _openai_error(scenario: str) -> ErrorReply:
    def body(message: str, kind: str, code: str | None) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    if scenario == "http-429":
        return ErrorReply(
            429,
            {"retry-after": str(RETRY_AFTER_S), "x-ratelimit-remaining-requests": "0"},
            body(
                "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested "
                f"1. Please try again in {RETRY_AFTER_S}s.",
                "requests",
                "rate_limit_exceeded",
            ),
        )
    if scenario == "http-401":
        return ErrorReply(
            401,
            {},
            body(
                "Incorrect API key provided: fake-key***********. You can find your API key "
                "at https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            ),
        )
    if scenario == "quota":
        return ErrorReply(
            429,
            {},
            body(
                "You exceeded your current quota, please check your plan and billing "
                "details. For more information on this error, read the docs: "
                "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                "insufficient_quota",
                "insufficient_quota",
            ),
        )
    return ErrorReply(
        500,
        {},
        body(
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            None,
        ),
    )


# --------------------------------------------------------------------------- Responses
class Responses:
    name = "responses"

    def conversation(self, body: dict[str, Any]) -> Conversation:
        items: list[Item] = []
        if body.get("instructions"):
            items.append(Item("system", "text", text_of(body["instructions"])))
        raw = body.get("input")
        if isinstance(raw, str):
            raw = [{"type": "message", "role": "user", "content": raw}]
        for entry in raw or []:
            kind = entry.get("type", "message")
            if kind == "message":
                role = entry.get("role", "user")
                role = "system" if role in ("system", "developer") else role
                items.append(Item(role, "text", text_of(entry.get("content"))))
            elif kind.endswith("_call_output"):
                items.append(Item("user", "tool_result", text_of(entry.get("output"))))
            elif kind.endswith("_call"):
                items.append(Item("assistant", "tool_call", str(entry.get("arguments", ""))))
        tools = [
            {"name": t.get("name"), "parameters": t.get("parameters") or {}}
            for t in body.get("tools") or []
            if t.get("type") == "function"
        ]
        for space in body.get("tools") or []:
            if space.get("type") == "namespace":  # codex 0.169.0: an MCP server's tools
                tools += [
                    {"name": t.get("name"), "parameters": t.get("parameters") or {},
                     "namespace": space.get("name")}
                    for t in space.get("tools") or []
                ]  # fmt: skip
        return Conversation(items, tools)

    @staticmethod
    def _usage() -> dict[str, Any]:
        return {
            "input_tokens": USAGE.input_tokens,
            "input_tokens_details": {"cached_tokens": USAGE.cached_input_tokens},
            "output_tokens": USAGE.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": USAGE.total_tokens,
        }

    def _item(self, answer: Answer, item_id: str, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if answer.tool_name:
            return {
                "id": item_id,
                "type": "function_call",
                "status": status,
                "call_id": "call_" + item_id[3:],
                "name": answer.tool_name,
                "arguments": json.dumps(answer.tool_args) if done else "",
                **({"namespace": answer.tool_namespace} if answer.tool_namespace else {}),
            }
        content = [{"type": "output_text", "text": answer.text, "annotations": []}]
        return {
            "id": item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content if done else [],
        }

    def _response(
        self, answer: Answer, resp_id: str, output: list[Any], status: str
    ) -> dict[str, Any]:
        return {
            "id": resp_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": answer.model,
            "output": output,
            "usage": self._usage() if status == "completed" else None,
        }

    def stream(self, answer: Answer) -> Iterator[bytes]:
        resp_id = _id("resp_")
        item_id = _id("fc_" if answer.tool_name else "msg_")
        seq = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

        yield event("response.created", response=self._response(answer, resp_id, [], "in_progress"))
        yield event(
            "response.in_progress", response=self._response(answer, resp_id, [], "in_progress")
        )
        yield event(
            "response.output_item.added",
            output_index=0,
            item=self._item(answer, item_id, done=False),
        )
        if answer.tool_name:
            arguments = json.dumps(answer.tool_args)
            yield event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=0,
                delta=arguments,
            )
            yield event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=0,
                arguments=arguments,
            )
        else:
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event(
                "response.content_part.added",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part=part,
            )
            for chunk in answer.chunks:
                yield event(
                    "response.output_text.delta",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    delta=chunk,
                )
            if answer.truncated:
                return
            yield event(
                "response.output_text.done",
                item_id=item_id,
                output_index=0,
                content_index=0,
                text=answer.text,
            )
            yield event(
                "response.content_part.done",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part={**part, "text": answer.text},
            )
        done_item = self._item(answer, item_id, done=True)
        yield event("response.output_item.done", output_index=0, item=done_item)
        yield event(
            "response.completed", response=self._response(answer, resp_id, [done_item], "completed")
        )

    def complete(self, answer: Answer) -> dict[str, Any]:
        item = self._item(answer, _id("fc_" if answer.tool_name else "msg_"), done=True)
        return self._response(answer, _id("resp_"), [item], "completed")

    def error(self, scenario: str) -> ErrorReply:
        return _openai_error(scenario)


# --------------------------------------------------------------------------- Chat
class Chat:
    name = "chat"

    def conversation(self, body: dict[str, Any]) -> Conversation:
        items: list[Item] = []
        for message in body.get("messages") or []:
            role = message.get("role", "user")
            if role == "tool":
                items.append(Item("user", "tool_result", text_of(message.get("content"))))
                continue
            role = "system" if role in ("system", "developer") else role
            text = text_of(message.get("content"))
            if text:
                items.append(Item(role, "text", text))
            for call in message.get("tool_calls") or []:
                items.append(
                    Item(role, "tool_call", str(call.get("function", {}).get("arguments")))
                )
        tools = [
            {
                "name": t.get("function", {}).get("name"),
                "parameters": t.get("function", {}).get("parameters") or {},
            }
            for t in body.get("tools") or []
        ]
        return Conversation(items, tools)

    @staticmethod
    def _usage() -> dict[str, Any]:
        return {
            "prompt_tokens": USAGE.input_tokens,
            "completion_tokens": USAGE.output_tokens,
            "total_tokens": USAGE.total_tokens,
            "prompt_tokens_details": {"cached_tokens": USAGE.cached_input_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def stream(self, answer: Answer, include_usage: bool = True) -> Iterator[bytes]:
        chat_id, created = _id("chatcmpl-"), int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse(
                {
                    "id": chat_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": answer.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        yield chunk({"role": "assistant", "content": ""})
        if answer.tool_name:
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": _id("call_"),
                            "type": "function",
                            "function": {"name": answer.tool_name, "arguments": ""},
                        }
                    ]
                }
            )
            yield chunk(
                {
                    "tool_calls": [
                        {"index": 0, "function": {"arguments": json.dumps(answer.tool_args)}}
                    ]
                }
            )
            finish = "tool_calls"
        else:
            for piece in answer.chunks:
                yield chunk({"content": piece})
            finish = "stop"
        if answer.truncated:
            return
        yield chunk({}, finish)
        if include_usage:
            yield sse(
                {
                    "id": chat_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": answer.model,
                    "choices": [],
                    "usage": self._usage(),
                }
            )
        yield sse("[DONE]")

    def complete(self, answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
        if answer.tool_name:
            message["tool_calls"] = [
                {
                    "id": _id("call_"),
                    "type": "function",
                    "function": {
                        "name": answer.tool_name,
                        "arguments": json.dumps(answer.tool_args),
                    },
                }
            ]
        return {
            "id": _id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": answer.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if answer.tool_name else "stop",
                }
            ],
            "usage": self._usage(),
        }

    def error(self, scenario: str) -> ErrorReply:
        return _openai_error(scenario)


# --------------------------------------------------------------------------- Gemini
class Gemini:
    name = "gemini"

    def conversation(self, body: dict[str, Any]) -> Conversation:
        items: list[Item] = []
        system = body.get("systemInstruction") or body.get("system_instruction")
        if system:
            items.append(Item("system", "text", text_of(system.get("parts"))))
        for content in body.get("contents") or []:
            role = "assistant" if content.get("role") == "model" else "user"
            for part in content.get("parts") or []:
                if "functionCall" in part:
                    items.append(Item(role, "tool_call", json.dumps(part["functionCall"])))
                elif "functionResponse" in part:
                    response = part["functionResponse"].get("response")
                    items.append(Item(role, "tool_result", text_of(response)))
                elif part.get("text") and not part.get("thought"):
                    items.append(Item(role, "text", part["text"]))
        tools = []
        for tool in body.get("tools") or []:
            for decl in tool.get("functionDeclarations") or []:
                schema = decl.get("parametersJsonSchema") or decl.get("parameters") or {}
                tools.append({"name": decl.get("name"), "parameters": _lower_types(schema)})
        return Conversation(items, tools)

    @staticmethod
    def _usage() -> dict[str, Any]:
        return {
            "promptTokenCount": USAGE.input_tokens,
            "candidatesTokenCount": USAGE.output_tokens,
            "totalTokenCount": USAGE.total_tokens,
            "cachedContentTokenCount": USAGE.cached_input_tokens,
        }

    def _chunk(
        self, answer: Answer, parts: list[dict[str, Any]], resp_id: str, finish: bool
    ) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = "STOP"
        return {
            "candidates": [candidate],
            "usageMetadata": self._usage(),
            "modelVersion": answer.model,
            "responseId": resp_id,
        }

    def stream(self, answer: Answer) -> Iterator[bytes]:
        resp_id = _id("")
        if answer.tool_name:
            call = {"functionCall": {"name": answer.tool_name, "args": answer.tool_args}}
            yield sse(self._chunk(answer, [call], resp_id, finish=True))
            return
        chunks = answer.chunks or ("",)
        for index, piece in enumerate(chunks):
            last = index == len(chunks) - 1 and not answer.truncated
            yield sse(self._chunk(answer, [{"text": piece}], resp_id, finish=last))

    def complete(self, answer: Answer, json_schema: dict[str, Any] | None = None) -> dict[str, Any]:
        if answer.tool_name:
            parts: list[dict[str, Any]] = [
                {"functionCall": {"name": answer.tool_name, "args": answer.tool_args}}
            ]
        elif json_schema is not None:
            parts = [{"text": json.dumps(sample_json(json_schema))}]
        else:
            parts = [{"text": answer.text}]
        return self._chunk(answer, parts, _id(""), finish=True)

    def error(self, scenario: str) -> ErrorReply:
        def body(
            code: int, status: str, message: str, details: list[Any] | None = None
        ) -> dict[str, Any]:
            error: dict[str, Any] = {"code": code, "message": message, "status": status}
            if details:
                error["details"] = details
            return {"error": error}

        def quota_failure(quota_id: str, metric: str) -> dict[str, Any]:
            return {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": f"generativelanguage.googleapis.com/{metric}",
                        "quotaId": quota_id,
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
                        "quotaValue": "10",
                    }
                ],
            }

        retry_info = {
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": f"{RETRY_AFTER_S}s",
        }
        if scenario == "http-429":
            return ErrorReply(
                429,
                {"retry-after": str(RETRY_AFTER_S)},
                body(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "Resource has been exhausted (e.g. check quota).",
                    [
                        quota_failure(
                            "GenerateRequestsPerMinutePerProjectPerModel",
                            "generate_content_requests",
                        ),
                        retry_info,
                    ],
                ),
            )
        if scenario == "http-401":
            return ErrorReply(
                401,
                {},
                body(
                    401,
                    "UNAUTHENTICATED",
                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential.",
                ),
            )
        if scenario == "quota":
            return ErrorReply(
                429,
                {},
                body(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "You exceeded your current quota, please check your plan and billing "
                    "details. For more information on this error, head to: "
                    "https://ai.google.dev/gemini-api/docs/rate-limits.",
                    [
                        quota_failure(
                            "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                            "generate_content_free_tier_requests",
                        )
                    ],
                ),
            )
        return ErrorReply(
            500,
            {},
            body(
                500,
                "INTERNAL",
                "An internal error has occurred. Please retry or report in "
                "https://developers.generativeai.google/guide/troubleshooting",
            ),
        )


def _lower_types(schema: Any) -> Any:
    """Gemini's OpenAPI-style schemas spell types in capitals (``STRING``)."""
    if isinstance(schema, dict):
        return {
            k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def sample_json(schema: Any) -> Any:
    """A small value matching a JSON schema (Gemini CLI's structured side calls).

    For an enum the first value is used, except that a ``next_speaker`` style choice picks
    ``"user"`` so the CLI ends its turn.
    """
    schema = _lower_types(schema or {})
    if schema.get("enum"):
        return "user" if "user" in schema["enum"] else schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {k: sample_json(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    return "fake"


class Api(Protocol):
    name: str

    def conversation(self, body: dict[str, Any]) -> Conversation: ...

    def stream(self, answer: Answer) -> Iterator[bytes]: ...

    def complete(self, answer: Answer) -> dict[str, Any]: ...

    def error(self, scenario: str) -> ErrorReply: ...


APIS: dict[str, Api] = {
    "anthropic": Anthropic(),
    "responses": Responses(),
    "chat": Chat(),
    "gemini": Gemini(),
}
__all__ = [
    "APIS",
    "Answer",
    "Api",
    "Chat",
    "ErrorReply",
    "Gemini",
    "sample_json",
    "shell_arguments",
    "sse",
]
