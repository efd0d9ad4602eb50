"""The fake model server: four vendor APIs on one loopback port, scripted by scenario.

Routes (matched on the path's ending, so any base-URL prefix works):

- ``POST …/messages`` Anthropic Messages (``?beta=true`` ignored), ``…/messages/count_tokens``
- ``POST …/responses`` OpenAI Responses
- ``POST …/chat/completions`` OpenAI Chat Completions
- ``POST …/models/{model}:streamGenerateContent`` / ``:generateContent`` / ``:countTokens``
  Gemini
- anything else: 404 with a JSON error, and still logged.

Every request is logged as a :class:`RecordedRequest` (auth header values redacted).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakemodel.apis import APIS, Answer, Chat, Gemini, sse
from tests.fakemodel.limits import Windows, limited_reply
from tests.fakemodel.scenarios import (
    DEFAULT_SLOW_DELAY_S,
    EDIT_COMMAND,
    HELD_COMMAND,
    MCP_ARGUMENTS,
    MCP_FINAL_PREFIX,
    MCP_SERVER,
    MCP_TOOL,
    SCENARIOS,
    SLOW_CHUNKS,
    STRUCTURED_TOOL,
    TEXT_ANSWER,
    TOOL_COMMAND,
    TOOL_SEARCH,
    TRUNCATED_TEXT,
    USAGE,
    Conversation,
    choose,
    final_tool_text,
    images_in,
    schema_offered,
    shell_arguments,
    structured_answer,
)

ERROR_SCENARIOS = frozenset({"http-429", "http-401", "quota", "http-500"})
REDACTED_HEADERS = frozenset(
    {"authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "proxy-authorization"}
)
REDACTED = "<redacted>"


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    """The path without the query string."""
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-cased names; values of auth headers replaced by ``<redacted>``."""
    body: Any
    """The JSON body (None when there was none or it was not JSON)."""
    api: str | None
    """``anthropic``, ``responses``, ``chat``, ``gemini``, or None for an unknown route."""
    scenario: str | None = None
    requested_model: str | None = None
    answered_model: str | None = None
    status: int = 0
    streamed: bool = False
    kind: str = "turn"
    """``turn`` (a model call), or a side call: ``count_tokens``, ``unknown``."""
    time: float = field(default_factory=time.time)
    credentials: tuple[str, ...] = ()
    """The key values the request carried, unredacted (``x-api-key``, ``x-goog-api-key``,
    ``api-key``, ``Authorization: Bearer``, a ``key=`` query parameter): what a test of the
    model gateway compares with the real key and its stand-in. Never in :meth:`as_dict`."""

    @property
    def conversation(self) -> Conversation | None:
        if self.api is None or not isinstance(self.body, dict):
            return None
        return APIS[self.api].conversation(self.body)

    def system_text(self) -> str:
        """The text that landed in the system slot (Anthropic ``system``, Responses
        ``instructions`` and developer/system items, chat system messages, Gemini
        ``systemInstruction``)."""
        conv = self.conversation
        if conv is None:
            return ""
        return "\n".join(i.text for i in conv.items if i.role == "system")

    def user_texts(self) -> list[str]:
        conv = self.conversation
        return (
            []
            if conv is None
            else [i.text for i in conv.items if i.role == "user" and i.kind == "text"]
        )

    def assistant_texts(self) -> list[str]:
        conv = self.conversation
        return (
            []
            if conv is None
            else [i.text for i in conv.items if i.role == "assistant" and i.kind == "text"]
        )

    def tool_names(self) -> list[str]:
        conv = self.conversation
        return [] if conv is None else [str(t.get("name")) for t in conv.tools]

    def body_text(self) -> str:
        return json.dumps(self.body, ensure_ascii=False) if self.body is not None else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
            "api": self.api,
            "scenario": self.scenario,
            "requested_model": self.requested_model,
            "answered_model": self.answered_model,
            "status": self.status,
            "streamed": self.streamed,
            "kind": self.kind,
            "time": self.time,
        }


def _route(path: str) -> tuple[str | None, str, str | None]:
    """(api, kind, model-from-path) for a request path."""
    if path.endswith("/messages/count_tokens"):
        return "anthropic", "count_tokens", None
    if path.endswith("/messages"):
        return "anthropic", "turn", None
    if path.endswith("/responses"):
        return "responses", "turn", None
    if path.endswith("/chat/completions"):
        return "chat", "turn", None
    if "/models/" in path and ":" in path.rsplit("/", 1)[-1]:
        model, _, method = unquote(path.rsplit("/models/", 1)[1]).partition(":")
        if method == "streamGenerateContent":
            return "gemini", "stream", model
        if method == "generateContent":
            return "gemini", "turn", model
        if method == "countTokens":
            return "gemini", "count_tokens", model
    return None, "unknown", None


def _structured(conv: Conversation, valid: bool, model: str) -> Answer:
    """The ``structured`` scenarios: the answer as JSON text, or as the input of Claude Code's
    StructuredOutput tool when it is offered (then a short final text once it ran)."""
    answer = structured_answer(conv, valid)
    if any(t.get("name") == STRUCTURED_TOOL for t in conv.tools):
        if conv.tool_results():
            return Answer(model, ("Done.",))
        return Answer(model, tool_name=STRUCTURED_TOOL, tool_args=answer)
    return Answer(model, (json.dumps(answer),))


def _mcp(conv: Conversation, model: str) -> Answer:
    """The ``mcp`` scenario: call the attached tool (after selecting it with ToolSearch where
    it is deferred), then answer with what it returned."""
    result = conv.mcp_result()
    if result is not None:
        return Answer(model, (MCP_FINAL_PREFIX + result.strip()[:200],))
    tool = conv.mcp_tool()
    if tool is not None:
        return Answer(
            model, tool_name=str(tool["name"]), tool_args=dict(MCP_ARGUMENTS),
            tool_namespace=tool.get("namespace"),
        )  # fmt: skip
    if any(t.get("name") == TOOL_SEARCH for t in conv.tools) and not conv.tool_results():
        query = {"query": f"select:mcp__{MCP_SERVER}__{MCP_TOOL}", "max_results": 5}
        return Answer(model, tool_name=TOOL_SEARCH, tool_args=query)
    return Answer(model, (TEXT_ANSWER,))


def _credentials(headers: Any, query: dict[str, list[str]]) -> tuple[str, ...]:
    found = []
    for name, value in headers:
        lowered = name.lower()
        if lowered == "authorization" and value.lower().startswith("bearer "):
            found.append(value[7:].strip())
        elif lowered in ("x-api-key", "x-goog-api-key", "api-key"):
            found.append(value.strip())
    return (*found, *query.get("key", []))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(None)

    def do_POST(self) -> None:
        self._handle(self._read_body())

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            raw = b"".join(parts)
        else:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        encoding = self.headers.get("content-encoding", "").lower()
        if encoding == "gzip":
            raw = gzip.decompress(raw)
        elif encoding == "deflate":
            raw = zlib.decompress(raw)
        return raw

    def _handle(self, raw: bytes | None) -> None:
        split = urlsplit(self.path)
        api, kind, path_model = _route(split.path)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(
            method=self.command,
            path=split.path,
            query=parse_qs(split.query),
            headers={
                k.lower(): (REDACTED if k.lower() in REDACTED_HEADERS else v)
                for k, v in self.headers.items()
            },
            body=body,
            api=api,
            kind=kind if kind in ("count_tokens", "unknown") else "turn",
            credentials=_credentials(self.headers.items(), parse_qs(split.query)),
        )
        self.server.fake.record(record)
        try:
            self._respond(record, api, kind, path_model)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _respond(
        self, record: RecordedRequest, api: str | None, kind: str, path_model: str | None
    ) -> None:
        fake = self.server.fake
        body = record.body if isinstance(record.body, dict) else {}
        if api is None or self.command != "POST":
            record.status = 404
            self._json(
                404,
                {
                    "error": {
                        "message": f"no route for {self.command} {record.path}",
                        "type": "not_found",
                        "code": 404,
                    }
                },
            )
            return
        handler = APIS[api]
        conv = handler.conversation(body)
        conv.images, conv.schema_offered = images_in(body), schema_offered(body)
        requested = path_model or (
            body.get("model") if isinstance(body.get("model"), str) else None
        )
        choice = choose(conv, fake.scenario, fake.slow_delay, fake.answer_model)
        record.scenario = choice.scenario
        record.requested_model = requested
        model = choice.answer_model or requested or "fake-model"
        record.answered_model = model

        if requested is not None and requested in fake.failing_models:
            record.status = 529
            self._json(
                529,
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            )
            return
        if kind == "count_tokens":
            record.status = 200
            key = "totalTokens" if api == "gemini" else "input_tokens"
            self._json(200, {key: USAGE.input_tokens})
            return
        window = limited_reply(fake.windows, handler, conv.prompt_text())
        if window is not None:  # a limit that ends (tests/fakemodel/limits.py)
            record.scenario = "limited"
            record.status = window.status
            self._json(window.status, window.body, window.headers)
            return
        if choice.scenario in ERROR_SCENARIOS:
            reply = handler.error(choice.scenario)
            record.status = reply.status
            self._json(reply.status, reply.body, reply.headers)
            return

        if choice.final_delay_s and conv.tool_results():
            time.sleep(choice.final_delay_s)
        answer = self._answer(conv, choice.scenario, model, self.server.fake.forbidden_command)
        streamed = kind == "stream" or (api != "gemini" and body.get("stream") is True)
        record.streamed = streamed
        record.status = 200
        if not streamed:
            if api == "gemini":
                config = body.get("generationConfig") or {}
                schema = config.get("responseJsonSchema") or config.get("responseSchema")
                if config.get("responseMimeType") == "application/json" and schema is None:
                    schema = {}
                assert isinstance(handler, Gemini)
                payload = handler.complete(answer, schema)
            else:
                payload = handler.complete(answer)
            self._json(200, payload)
            return
        if isinstance(handler, Chat):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            frames: Iterator[bytes] = handler.stream(answer, include_usage=include_usage)
        else:
            frames = handler.stream(answer)
        delay = choice.delay_s if choice.scenario == "slow" else 0.0
        self._stream(frames, delay, answer.truncated)

    @staticmethod
    def _answer(conv: Conversation, scenario: str, model: str, forbidden: str = "") -> Answer:
        if scenario in ("tool", "edit", "forbidden", "held"):
            results = conv.tool_results()
            if results:
                return Answer(model, (final_tool_text(results),))
            tool = conv.shell_tool()
            if tool is not None:
                return Answer(
                    model,
                    tool_name=str(tool["name"]),
                    tool_args=shell_arguments(
                        tool,
                        {"edit": EDIT_COMMAND, "forbidden": forbidden, "held": HELD_COMMAND}.get(
                            scenario, TOOL_COMMAND
                        ),
                    ),
                )
            return Answer(model, (TEXT_ANSWER,))
        if scenario in ("structured", "structured-invalid"):
            return _structured(conv, scenario == "structured", model)
        if scenario == "mcp":
            return _mcp(conv, model)
        if scenario == "slow":
            size = -(-len(TEXT_ANSWER) // SLOW_CHUNKS)
            pieces = tuple(TEXT_ANSWER[i : i + size] for i in range(0, len(TEXT_ANSWER), size))
            return Answer(model, pieces)
        if scenario == "truncated":
            half = len(TRUNCATED_TEXT) // 2
            return Answer(model, (TRUNCATED_TEXT[:half], TRUNCATED_TEXT[half:]), truncated=True)
        return Answer(model, ("Hello from ", TEXT_ANSWER[len("Hello from ") :]))

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _stream(self, frames: Iterator[bytes], delay: float, truncated: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for index, frame in enumerate(frames):
            if index and delay:
                time.sleep(delay)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        if truncated:
            # Close mid-body, without the chunked terminator: the client sees the
            # connection drop before the stream's end event.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up on a kept-alive connection (pi does) is not a server error.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeModelServer:
    """The fake model server, in a background thread on ``127.0.0.1`` (or ``host``; with
    ``tls``, HTTPS, and ``name`` in its URL).

    ``with FakeModelServer() as fake:`` starts it on a free port (or ``port``); ``fake.url``
    is the base URL without a path (``http://127.0.0.1:PORT``). ``scenario`` is the default
    for requests whose prompt has no ``[scenario:…]`` marker; ``answer_model`` (default:
    echo the requested model) is the model responses claim; ``slow_delay`` the pause between
    SSE frames in the ``slow`` scenario.
    """

    def __init__(
        self,
        scenario: str = "text",
        *,
        port: int = 0,
        answer_model: str | None = None,
        slow_delay: float = DEFAULT_SLOW_DELAY_S,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
        name: str | None = None,
    ) -> None:
        self.host = host
        self.tls = tls
        self.name = name or host
        """The host name in :attr:`url` (a name the egress gateway pins to ``host``)."""
        self.forbidden_command = ""
        """The shell command of the ``forbidden`` scenario's tool call (set by the test: it
        tries servers the run may not reach)."""
        self.set_scenario(scenario)
        self.answer_model = answer_model
        self.slow_delay = slow_delay
        self.failing_models: set[str] = set()
        """Models answered 529 (overloaded) whatever the scenario: a model gateway's fallback
        goes to the next model."""
        self.windows = Windows()
        """Open windows of ``[limited:...]`` markers (tests/fakemodel/limits.py)."""
        self._requested_port = port
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> FakeModelServer:
        if self._httpd is not None:
            return self
        httpd = _HTTPServer((self.host, self._requested_port), _Handler)
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="fake-model-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fake model server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.name}:{self.port}"

    # -- scripting
    def set_scenario(self, name: str) -> None:
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        self.scenario = name

    # -- the log
    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._requests)

    def model_requests(self) -> list[RecordedRequest]:
        """Only the model calls (no count_tokens, no unknown routes)."""
        return [r for r in self.requests if r.kind == "turn"]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def reset(self) -> None:
        """Back to the defaults, with an empty log (between tests)."""
        self.clear()
        self.windows.clear()
        self.scenario = "text"
        self.answer_model = None
        self.slow_delay = DEFAULT_SLOW_DELAY_S
        self.failing_models.clear()


__all__ = ["ERROR_SCENARIOS", "FakeModelServer", "RecordedRequest", "sse"]
