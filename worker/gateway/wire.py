"""The four model APIs' wire, as the model gateway sees it: which API a request path is, which
model it asks for (and the same request asking another model, for a fallback), and what the
response said (usage, the model that answered, a limit), read from its bytes as they pass.

Pure: the standard library, orjson and the error classification of adapters/errors.py; no I/O.

Paths are matched on their ending, as tests/fakemodel/server.py routes them, so any base-URL
prefix works: ``…/messages`` (Anthropic), ``…/responses`` (OpenAI Responses),
``…/chat/completions`` (OpenAI Chat Completions), ``…/models/{model}:generateContent`` and
``:streamGenerateContent`` (Gemini). Token counting calls (``…/messages/count_tokens``,
``:countTokens``) belong to their API but are not model calls.

Usage is counted the same way for every API (:class:`Exchange`): ``input_tokens`` is the whole
prompt, the part read from a cache included; ``cached_input_tokens`` is that part;
``output_tokens`` is everything generated, reasoning included. Each vendor spells it so:

* Anthropic: input = ``input_tokens`` + ``cache_creation_input_tokens`` +
  ``cache_read_input_tokens`` (its ``input_tokens`` is only the uncached rest); cached =
  ``cache_read_input_tokens`` (a cache write is prompt read fresh, billed above the input rate,
  so it is not "cached"). A stream's ``message_start`` carries ``message.usage``; each
  ``message_delta`` carries cumulative counts that replace the fields they name.
* Responses: ``usage.input_tokens``, ``usage.input_tokens_details.cached_tokens``,
  ``usage.output_tokens`` (in ``response.completed`` when streamed).
* Chat Completions: ``prompt_tokens``, ``prompt_tokens_details.cached_tokens``,
  ``completion_tokens``. A stream carries usage only when the request set
  ``stream_options.include_usage`` (a last chunk with empty ``choices``).
* Gemini: input = ``promptTokenCount`` (cached part included) + ``toolUsePromptTokenCount``;
  cached = ``cachedContentTokenCount``; output = ``candidatesTokenCount`` +
  ``thoughtsTokenCount``. Every streamed chunk's ``usageMetadata`` is cumulative: the last wins.

What the :class:`Meter` cannot read it leaves at zero with ``complete`` False: a body the
upstream compressed although the gateway asked for ``identity`` (``content-encoding`` gzip, br,
zstd: decompressing it here would cost more than the metering is worth), a JSON body over
:data:`MAX_JSON_BYTES`, an SSE event over :data:`MAX_LINE_BYTES`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import quote, unquote

import orjson

from adapters.errors import classify, retry_after_in

__all__ = [
    "API",
    "ERROR_BODY_BYTES",
    "MAX_JSON_BYTES",
    "MAX_LINE_BYTES",
    "Exchange",
    "Limit",
    "Meter",
    "api_of",
    "fallback_worthy",
    "is_model_call",
    "requested_model",
    "retry_after_from",
    "with_model",
]

API = Literal["anthropic", "responses", "chat", "gemini"]
Limit = Literal["rate-limited", "quota", "overloaded"]

MAX_JSON_BYTES = 4 * 1024 * 1024
"""A JSON body longer than this is passed on unparsed (its usage is not counted)."""
MAX_LINE_BYTES = 1024 * 1024
"""An SSE event whose lines are longer than this, together, is skipped, never held."""
ERROR_BODY_BYTES = 64 * 1024
"""How much of an error body is read for its message and classification."""
ERROR_MESSAGE_CHARS = 500

_GEMINI_CALLS = {"generateContent": True, "streamGenerateContent": True, "countTokens": False}


# --------------------------------------------------------------------------- requests
def _route(path: str) -> tuple[API | None, bool]:
    """(API, whether it is a model call) for a request path, its query string ignored."""
    path = path.partition("?")[0]
    if path.endswith("/messages"):
        return "anthropic", True
    if path.endswith("/messages/count_tokens"):
        return "anthropic", False
    if path.endswith("/responses"):
        return "responses", True
    if path.endswith("/chat/completions"):
        return "chat", True
    gemini = _gemini_path(path)
    if gemini is not None:
        return "gemini", _GEMINI_CALLS[gemini[2]]
    return None, False


def _gemini_path(path: str) -> tuple[str, str, str] | None:
    """(prefix up to ``/models/``, model, method) of a Gemini call's path, or None."""
    head, sep, tail = path.partition("?")[0].rpartition("/models/")
    if not sep:
        return None
    model, colon, method = tail.rpartition(":")
    if not colon:  # the colon itself URL-quoted
        model, colon, method = unquote(tail).rpartition(":")
    if not colon or method not in _GEMINI_CALLS or not model or "/" in model:
        return None
    return head + sep, unquote(model), method


def api_of(path: str) -> API | None:
    """The API a request path belongs to, token counting calls included; None if none."""
    return _route(path)[0]


def is_model_call(path: str) -> bool:
    """Whether the path is a generation call (not ``count_tokens`` nor anything else)."""
    return _route(path)[1]


def requested_model(api: API, path: str, body: object) -> str | None:
    """The model a request asks for: the body's ``model``, or Gemini's path segment."""
    if api == "gemini":
        found = _gemini_path(path)
        return found[1] if found else None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def with_model(api: API, path: str, body: dict[str, Any], model: str) -> tuple[str, dict[str, Any]]:
    """The same request asking ``model``: a copy of the body with its ``model`` replaced, or
    for Gemini the path's model segment replaced (URL-quoted; a ``models/`` prefix dropped).
    The body given is not changed; a path's query string is kept."""
    if api != "gemini":
        return path, {**body, "model": model}
    found = _gemini_path(path)
    if found is None:
        raise ValueError(f"not a Gemini model call: {path!r}")
    head, _, method = found
    _, mark, query = path.partition("?")
    segment = quote(model.removeprefix("models/"), safe="")
    return f"{head}{segment}:{method}{mark}{query}", dict(body)


def fallback_worthy(status: int) -> bool:
    """Whether another model may answer what this status refused: a server fault or overload
    (500-599, Anthropic's 529 included), except 501, the upstream not implementing the call at
    all (another model behind it will not either)."""
    return 500 <= status <= 599 and status != 501


# --------------------------------------------------------------------------- responses
@dataclass
class Exchange:
    """What one response said, as metered (see the module docstring for the token counts)."""

    api: API | None
    status: int
    requested_model: str | None
    served_model: str | None
    """The model the API says answered: Anthropic ``message.model``, Responses
    ``response.model``, Chat ``model``, Gemini ``modelVersion``."""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    limit: Limit | None = None
    """For a non-2xx answer (or an error event inside a stream): a rate limit, an empty
    quota (credits, billing: even when said with 400), or an overloaded API (529, or a 5xx
    saying so). Other errors (auth, bad request, server faults) are None."""
    retry_after_s: float | None = None
    error: str | None = None
    """The upstream's error message (at most 500 characters), for a non-2xx answer or an
    error event inside a stream."""
    complete: bool = False
    """The response carried its final usage: False for a stream cut short (what it had said
    is still counted), a Chat stream without ``include_usage``, an error, or a body not read."""


def retry_after_from(
    headers: Mapping[str, str], text: str = "", *, now: float | None = None
) -> float | None:
    """Seconds until a retry may succeed: ``retry-after-ms``, ``retry-after`` (seconds or an
    HTTP date), else what the body text says (Gemini's RetryInfo ``"retryDelay": "12s"``,
    OpenAI's "try again in 7s"). Header names lower-case."""
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value:
        seconds = _seconds(value)
        if seconds is not None:
            return seconds
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            pass
        else:
            return max(0.0, when - (time.time() if now is None else now))
    return retry_after_in(text) if text else None


def _seconds(value: str | None) -> float | None:
    try:
        number = float(value) if value else math.nan
    except ValueError:
        return None
    return max(0.0, number) if math.isfinite(number) else None


_OVERLOADED = re.compile(r"overloaded", re.I)


def _limit_of(status: int | None, text: str) -> Limit | None:
    """The limit an error says; ``status`` None for an error event inside a 2xx body (its own
    code, if the text names one, is used)."""
    if status == 529:
        return "overloaded"
    if (status is None or status >= 500) and _OVERLOADED.search(text):
        return "overloaded"
    reason = classify(text, status).reason
    if reason == "quota":
        return "quota"
    if reason == "rate-limited" and (status is None or status == 429):
        return "rate-limited"
    return None


def _error_message(raw: bytes) -> str | None:
    """The message of a vendor error body (``{"error": {"message"}}`` in all four APIs, in a
    one-element array from Gemini's streamGenerateContent), or None when it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(body, list) and body:
        body = body[0]
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    if isinstance(error, str):
        return error
    message = body.get("message")
    return message if isinstance(message, str) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # orjson refuses what json takes (an escaped lone surrogate, say)
        return json.loads(raw)
    except ValueError:
        return None


def _value_at(data: bytes, key: bytes, start: int, end: int) -> int:
    """Where a key starting with ``key`` first occurs in ``data[start:end]`` with a value other
    than null, else ``end``: a cheap test before parsing (a key can not occur inside a JSON
    string, whose quotes are escaped)."""
    at = data.find(key, start, end)
    while at >= 0:
        colon = data.find(b":", at + len(key))
        if colon < 0 or not data[colon + 1 : colon + 8].lstrip().startswith(b"null"):
            return at
        at = data.find(key, colon, end)
    return end


def _after_last_blank_line(data: bytes, start: int, end: int) -> int:
    """Where the events in ``data[start:end]`` end (``start``, at an event's start, if none
    does): after the last blank line, LF or CRLF, wholly before ``end``."""
    lf = data.rfind(b"\n\n", start - 1, end)
    # Only a CRLF blank line from the last LF one on can end later (an LF stream: no scan).
    crlf = data.rfind(b"\n\r\n", max(start - 1, lf), end)
    return max(start, lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


_ANTHROPIC_USAGE = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)
_RESPONSES_USAGE = ("input_tokens", "input_tokens_details", "output_tokens")
_CHAT_USAGE = ("prompt_tokens", "prompt_tokens_details", "completion_tokens")
_TERMINAL_RESPONSES = frozenset({"response.completed", "response.incomplete", "response.failed"})
_Mode = Literal["sse", "json", "sniff", "error", "skip"]


class Meter:
    """Fed a response's body bytes as they pass, never holding the body: parses JSON bodies
    (up to :data:`MAX_JSON_BYTES`) and SSE streams line by line for usage and the served
    model; for a non-2xx answer, reads the first :data:`ERROR_BODY_BYTES` for the error.

    SSE lines may end ``\\n`` or ``\\r\\n`` and be split anywhere across :meth:`feed` calls;
    an event's data may span several ``data:`` lines. Only the line in progress and the
    current event's data are held, and only while they can matter and total at most
    :data:`MAX_LINE_BYTES` (:attr:`held_bytes`): an event whose lines are longer, together,
    is skipped. Only events that carry usage, an error or a model not yet known are parsed
    (a substring test first): a chunk's run of text deltas is jumped over unread, so a long
    stream costs a few ``bytes.find`` per chunk, in C.
    """

    def __init__(
        self,
        api: API | None,
        status: int,
        headers: Mapping[str, str],
        requested_model: str | None,
    ) -> None:
        self._exchange = Exchange(api, status, requested_model, None)
        self._headers = headers
        self._finished = False
        self._parsed = 0  # events and bodies parsed (tests read it: the cheap path holds)
        self._anthropic: dict[str, int] = {}
        self._usage_seen = False
        # A JSON or error body, bounded.
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_over = False
        # SSE: the line in progress (held while it may be data or the blank line) and the
        # current event's data values.
        self._parts: list[bytes] = []
        self._parts_size = 0
        self._line_len = 0
        self._line_skip = False
        self._data: list[bytes] = []
        self._data_size = 0
        self._event_size = 0
        self._dropped = False
        self._mode = self._mode_for(api, status, headers)

    @staticmethod
    def _mode_for(api: API | None, status: int, headers: Mapping[str, str]) -> _Mode:
        encoded = headers.get("content-encoding", "").strip().lower() not in ("", "identity")
        if not 200 <= status < 300:
            return "skip" if encoded else "error"
        if api is None or encoded:
            return "skip"
        kind = headers.get("content-type", "").lower()
        if "text/event-stream" in kind:
            return "sse"
        if "json" in kind:
            return "json"
        return "sniff"

    @property
    def held_bytes(self) -> int:
        """Bytes of the body this meter holds now."""
        return self._parts_size + self._data_size + self._body_size

    # ----------------------------------------------------------------------- feeding
    def feed(self, data: bytes) -> None:
        """The next bytes of the body, as they came."""
        if not data:
            return
        mode = self._mode
        if mode == "sse":
            self._feed_sse(data)
        elif mode == "json" or mode == "error":
            self._feed_body(data, MAX_JSON_BYTES if mode == "json" else ERROR_BODY_BYTES)
        elif mode == "sniff":
            first = data.lstrip()[:1]
            if first:  # a body that opens with JSON is JSON; anything else is read as SSE
                self._mode = "json" if first in (b"{", b"[") else "sse"
                self.feed(data)

    def _feed_body(self, data: bytes, limit: int) -> None:
        if self._body_over:
            return
        room = limit - self._body_size
        if len(data) <= room:
            self._body.append(data)
            self._body_size += len(data)
        elif self._mode == "error":  # an error's first bytes say enough
            if room > 0:
                self._body.append(data[:room])
                self._body_size += room
            self._body_over = True
        else:  # a JSON body too long to parse: let it pass
            self._body, self._body_size, self._body_over = [], 0, True

    def _feed_sse(self, data: bytes) -> None:
        if (
            not self._line_len
            and not self._event_size
            and data.endswith((b"\n\n", b"\n\r\n"))
            and self._next_wanted(data, 0) == len(data)
        ):
            return  # whole events (a frame of a token, most often), none to read
        start = 0
        if self._line_len:  # a line begun in an earlier chunk
            end = data.find(b"\n")
            if end < 0:
                self._hold(data, 0)
                return
            if self._line_skip:
                self._end_skipped_line(self._line_len + end)
            else:
                line = b"".join((*self._parts, data[:end]))
                self._parts, self._parts_size = [], 0
                self._end_line(line, 0, len(line))
            self._line_len, self._line_skip = 0, False
            start = end + 1
        find = data.find
        wanted = -1
        end = find(b"\n", start)
        while end >= 0:
            ended = self._end_line(data, start, end)
            start = end + 1
            if ended:  # at an event's start: jump over the events before the next one wanted
                if wanted < start:
                    wanted = self._next_wanted(data, start)
                start = _after_last_blank_line(data, start, wanted)
            end = find(b"\n", start)
        if start < len(data):
            self._hold(data, start)

    def _hold(self, data: bytes, start: int) -> None:
        """The line in progress goes on with ``data[start:]`` (no line end in it)."""
        length = self._line_len + len(data) - start
        self._line_len = length
        if self._line_skip:
            return
        if self._dropped or self._event_size + length > MAX_LINE_BYTES:
            if not self._dropped:
                self._drop()
            # Of a skipped event only its end matters: a blank line ("" or "\r").
            self._parts, self._parts_size = [], 0
            if length == 1 and data[start] == 13:
                self._parts, self._parts_size = [b"\r"], 1
            else:
                self._line_skip = True
            return
        piece = data[start:]
        if self._parts_size < 5 <= length:  # the line's first five bytes are here: data?
            head = b"".join((*self._parts, piece[:5]))
            if not head.startswith(b"data:"):  # event:, id:, a comment: not needed
                self._parts, self._parts_size, self._line_skip = [], 0, True
                return
        self._parts.append(piece)
        self._parts_size += len(piece)

    def _end_skipped_line(self, length: int) -> None:
        # A skipped line is never blank: it only counts toward its event's size.
        self._event_size += length
        if not self._dropped and self._event_size > MAX_LINE_BYTES:
            self._drop()

    def _next_wanted(self, data: bytes, start: int) -> int:
        """Where, from ``start``, ``data`` may first say something the meter reads (a usage,
        an error, a model not yet known), else its length. Events wholly before it are plain
        (text deltas, mostly): :meth:`_feed_sse` jumps over them unread."""
        at = _value_at(data, b'"usage', start, len(data))
        at = _value_at(data, b'"error"', start, at)
        if self._exchange.served_model is None:
            model = data.find(b'"model', start, at)
            at = at if model < 0 else model
        return at

    def _end_line(self, buf: bytes, start: int, end: int) -> bool:
        """The line ``buf[start:end]`` (its ``\\n`` excluded) is complete; True if it was the
        blank line ending an event."""
        self._event_size += end - start
        stop = end - 1 if end > start and buf[end - 1] == 13 else end
        if stop == start:
            self._end_event()
            return True
        if self._dropped:
            return False
        if self._event_size > MAX_LINE_BYTES:
            self._drop()
        elif buf.startswith(b"data:", start, stop):
            begin = start + 6 if buf[start + 5 : start + 6] == b" " else start + 5
            self._data.append(buf[begin:stop])
            self._data_size += stop - begin
        return False

    def _drop(self) -> None:
        self._dropped = True
        self._data, self._data_size = [], 0

    def _end_event(self) -> None:
        data, keep = self._data, not self._dropped and self._event_size <= MAX_LINE_BYTES
        self._data, self._data_size, self._event_size, self._dropped = [], 0, 0, False
        if not data or not keep:
            return
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        if self._next_wanted(payload, 0) < len(payload):
            self._parsed += 1
            event = _loads(payload)
            if isinstance(event, dict):
                self._take(event, streamed=True)

    # ----------------------------------------------------------------------- reading
    def _take(self, obj: dict[str, Any], *, streamed: bool) -> None:
        api = self._exchange.api
        if api == "anthropic":
            self._take_anthropic(obj)
        elif api == "responses":
            self._take_responses(obj, streamed)
        elif api == "chat":
            if self._take_openai_usage(obj.get("usage"), _CHAT_USAGE):
                self._exchange.complete = True
            self._served(obj.get("model"))
        elif api == "gemini":
            self._take_gemini(obj)
        error = obj.get("error")
        if isinstance(error, dict) and api != "responses":
            self._error_inside(error)

    def _served(self, model: object) -> None:
        if self._exchange.served_model is None and isinstance(model, str) and model:
            self._exchange.served_model = model

    def _take_anthropic(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._served(message.get("model"))
                self._take_anthropic_usage(message.get("usage"))
        elif kind in ("message_delta", "message"):
            self._served(obj.get("model"))
            if self._take_anthropic_usage(obj.get("usage")):
                self._exchange.complete = True

    def _take_anthropic_usage(self, usage: object) -> bool:
        if not isinstance(usage, dict):
            return False
        counts = self._anthropic
        for key in _ANTHROPIC_USAGE:
            if isinstance(usage.get(key), int):
                counts[key] = _count(usage[key])
        ex = self._exchange
        ex.cached_input_tokens = counts.get("cache_read_input_tokens", 0)
        ex.input_tokens = sum(counts.get(k, 0) for k in _ANTHROPIC_USAGE[:3])
        ex.output_tokens = counts.get("output_tokens", 0)
        self._usage_seen = True
        return True

    def _take_responses(self, obj: dict[str, Any], streamed: bool) -> None:
        kind = obj.get("type")
        if kind == "error":  # {"type": "error", "code", "message"}
            self._error_inside(obj)
            return
        response = obj.get("response") if streamed else obj
        if not isinstance(response, dict):
            return
        self._served(response.get("model"))
        usage = response.get("usage")
        if self._take_openai_usage(usage, _RESPONSES_USAGE) and (
            not streamed or kind in _TERMINAL_RESPONSES
        ):
            self._exchange.complete = True
        if isinstance(response.get("error"), dict):  # response.failed
            self._error_inside(response["error"])

    def _take_openai_usage(self, usage: object, keys: tuple[str, str, str]) -> bool:
        if not isinstance(usage, dict):
            return False
        inputs, details_key, outputs = keys
        details = usage.get(details_key)
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        ex = self._exchange
        ex.input_tokens = _count(usage.get(inputs))
        ex.cached_input_tokens = _count(cached)
        ex.output_tokens = _count(usage.get(outputs))
        self._usage_seen = True
        return True

    def _take_gemini(self, obj: dict[str, Any]) -> None:
        self._served(obj.get("modelVersion"))
        usage = obj.get("usageMetadata")
        if not isinstance(usage, dict):
            return
        ex = self._exchange
        ex.input_tokens = _count(usage.get("promptTokenCount")) + _count(
            usage.get("toolUsePromptTokenCount")
        )
        ex.cached_input_tokens = _count(usage.get("cachedContentTokenCount"))
        ex.output_tokens = _count(usage.get("candidatesTokenCount")) + _count(
            usage.get("thoughtsTokenCount")
        )
        self._usage_seen = True
        candidates = obj.get("candidates")
        feedback = obj.get("promptFeedback")
        if (isinstance(feedback, dict) and feedback.get("blockReason")) or (
            isinstance(candidates, list)
            and any(isinstance(c, dict) and c.get("finishReason") for c in candidates)
        ):
            ex.complete = True

    def _error_inside(self, error: dict[str, Any]) -> None:
        """An error inside a 2xx body: Anthropic's ``error`` event, Responses'
        ``response.failed`` or ``error`` event, an ``error`` chunk of Chat or Gemini."""
        message = error.get("message")
        ex = self._exchange
        ex.error = (message if isinstance(message, str) else str(error))[:ERROR_MESSAGE_CHARS]
        text = orjson.dumps(error, default=str).decode()
        ex.limit = _limit_of(None, text)
        ex.retry_after_s = retry_after_in(text)

    # ----------------------------------------------------------------------- the end
    def finish(self) -> Exchange:
        """What the response said; the body ended (or broke off) here."""
        if self._finished:
            return self._exchange
        self._finished = True
        if self._mode == "sse":
            if self._line_skip:
                self._end_skipped_line(self._line_len)
            elif self._line_len:  # a last line without its end
                line = b"".join(self._parts)
                self._end_line(line, 0, len(line))
            self._parts, self._parts_size = [], 0
            self._line_len, self._line_skip = 0, False
            self._end_event()  # a last event without its blank line
        elif self._mode == "json":
            self._finish_json()
        elif self._mode == "error":
            self._finish_error()
        else:
            self._finish_unread()
        return self._exchange

    def _finish_json(self) -> None:
        raw, self._body, self._body_size = b"".join(self._body), [], 0
        if self._body_over or not raw:
            return
        self._parsed += 1
        body = _loads(raw)
        for obj in body if isinstance(body, list) else [body]:  # Gemini streams as an array
            if isinstance(obj, dict):
                self._take(obj, streamed=False)
        # A whole body parsed is complete when it carried usage, whatever it says of its end.
        self._exchange.complete = self._usage_seen

    def _finish_error(self) -> None:
        raw, self._body, self._body_size = b"".join(self._body), [], 0
        text = raw.decode("utf-8", "replace")
        ex = self._exchange
        message = _error_message(raw) or text.strip() or None
        ex.error = message[:ERROR_MESSAGE_CHARS] if message else None
        ex.limit = _limit_of(ex.status, text)
        ex.retry_after_s = retry_after_from(self._headers, text)

    def _finish_unread(self) -> None:
        ex = self._exchange
        if not 200 <= ex.status < 300:  # a compressed error body: the status says enough
            ex.limit = _limit_of(ex.status, "")
            ex.retry_after_s = retry_after_from(self._headers)
