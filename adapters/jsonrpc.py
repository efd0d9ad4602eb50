"""Newline-delimited JSON-RPC 2.0 over a harness's stdin/stdout, as pure values.

The ACP agents (``gemini --acp``, ``opencode acp``) and ``codex app-server`` speak it: we
send requests and notifications, they answer our requests and send their own requests
(permission prompts) that wait for our result. Each helper returns one line's bytes for
``state.outbox``; :func:`kind` tells what an incoming message is.
"""

from __future__ import annotations

import json
from typing import Any, Literal

Kind = Literal["response", "request", "notification", "other"]
METHOD_NOT_FOUND = -32601


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False).encode("utf-8") + b"\n"


def request(request_id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return _line(message)


def notification(method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"method": method}
    if params is not None:
        message["params"] = params
    return _line(message)


def result(request_id: Any, value: Any) -> bytes:
    return _line({"id": request_id, "result": value})


def error(request_id: Any, code: int, message: str) -> bytes:
    return _line({"id": request_id, "error": {"code": code, "message": message}})


def kind(message: dict[str, Any]) -> Kind:
    """A response to one of ours (``id`` and ``result``/``error``), a request that waits for
    our answer (``id`` and ``method``), a notification (``method`` only), or neither."""
    has_id = "id" in message and isinstance(message["id"], int | str)
    if isinstance(message.get("method"), str):
        return "request" if has_id else "notification"
    if has_id and ("result" in message or "error" in message):
        return "response"
    return "other"


def error_text(message: dict[str, Any]) -> str:
    """The text of a response's ``error`` (its ``message``, plus ``data`` when it says more)."""
    raw = message.get("error")
    if not isinstance(raw, dict):
        return str(raw)
    text = str(raw.get("message") or f"JSON-RPC error {raw.get('code')}")
    data = raw.get("data")
    if isinstance(data, dict):
        detail = data.get("message") or data.get("details") or data.get("errorName")
        if isinstance(detail, str) and detail and detail not in text:
            text = f"{text}: {detail}"
    elif isinstance(data, str) and data and data not in text:
        text = f"{text}: {data}"
    return text
