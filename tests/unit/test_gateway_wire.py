"""The model gateway's wire (worker/gateway/wire.py): paths, models, and what the four APIs'
responses say, metered from the bytes the fake model server's vendors really send
(tests/fakemodel/apis.py), however they are split."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from email.utils import formatdate
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakemodel.apis import APIS, Answer, Chat, sse
from tests.fakemodel.limits import RESET_S, Windows, limited_reply
from tests.fakemodel.scenarios import (
    RETRY_AFTER_S,
    TEXT_ANSWER,
    TOOL_COMMAND,
    TRUNCATED_TEXT,
    USAGE,
)
from worker.gateway import wire
from worker.gateway.wire import MAX_JSON_BYTES, MAX_LINE_BYTES, Exchange, Meter

SERVED = "claude-served-1"
ASKED = "asked-model"
SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}
API_NAMES: tuple[wire.API, ...] = ("anthropic", "responses", "chat", "gemini")
FULL = (USAGE.input_tokens, USAGE.output_tokens, USAGE.cached_input_tokens)


def _text() -> Answer:  # as tests/fakemodel/server.py answers the ``text`` scenario
    return Answer(SERVED, ("Hello from ", TEXT_ANSWER[len("Hello from ") :]))


def _tool() -> Answer:
    return Answer(SERVED, tool_name="Bash", tool_args={"command": TOOL_COMMAND})


def _truncated() -> Answer:
    half = len(TRUNCATED_TEXT) // 2
    return Answer(SERVED, (TRUNCATED_TEXT[:half], TRUNCATED_TEXT[half:]), truncated=True)


def _stream(api: wire.API, answer: Answer) -> bytes:
    return b"".join(APIS[api].stream(answer))


def _meter(
    api: wire.API | None,
    chunks: Iterable[bytes],
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Exchange:
    meter = Meter(api, status, SSE if headers is None else headers, ASKED)
    for chunk in chunks:
        meter.feed(chunk)
    return meter.finish()


def _tokens(exchange: Exchange) -> tuple[int, int, int]:
    return exchange.input_tokens, exchange.output_tokens, exchange.cached_input_tokens


def _chunkings(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """Any split of ``data`` into consecutive chunks (empty ones included)."""
    cuts = st.lists(st.integers(min_value=0, max_value=len(data)), max_size=20)
    return cuts.map(
        lambda points: [
            data[a:b]
            for a, b in zip([0, *sorted(points)], [*sorted(points), len(data)], strict=True)
        ]
    )


# --------------------------------------------------------------------------- paths and models
@pytest.mark.parametrize(
    ("path", "api", "model_call"),
    [
        ("/v1/messages", "anthropic", True),
        ("/v1/messages?beta=true", "anthropic", True),
        ("/anthropic/v1/messages/count_tokens?beta=true", "anthropic", False),
        ("/v1/responses", "responses", True),
        ("/backend-api/codex/responses", "responses", True),
        ("/v1/chat/completions", "chat", True),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "gemini", True),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "gemini", True),
        ("/v1beta/models/gemini-2.5-pro%3AstreamGenerateContent", "gemini", True),
        ("/v1beta/models/gemini-2.5-pro:countTokens", "gemini", False),
        ("/v1beta/models/gemini-2.5-pro:embedContent", None, False),
        ("/v1beta/models", None, False),
        ("/v1/models", None, False),
        ("/v1/messages/batches", None, False),
        ("/v1/complete", None, False),
    ],
)
def test_api_and_model_call_by_the_path_ending(
    path: str, api: wire.API | None, model_call: bool
) -> None:
    assert wire.api_of(path) == api
    assert wire.is_model_call(path) is model_call


def test_requested_model_from_the_body_or_geminis_path() -> None:
    assert wire.requested_model("anthropic", "/v1/messages", {"model": "claude-x"}) == "claude-x"
    assert wire.requested_model("responses", "/v1/responses", {"model": "gpt-5"}) == "gpt-5"
    assert wire.requested_model("chat", "/v1/chat/completions", {"model": 5}) is None
    assert wire.requested_model("chat", "/v1/chat/completions", ["model"]) is None
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert wire.requested_model("gemini", path, {"model": "ignored"}) == "gemini-2.5-flash"


def test_with_model_copies_the_body_with_the_other_model() -> None:
    body = {"model": "claude-a", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    path, changed = wire.with_model("anthropic", "/v1/messages?beta=true", body, "claude-b")
    assert path == "/v1/messages?beta=true"
    assert changed == {**body, "model": "claude-b"}
    assert body["model"] == "claude-a"  # the original request is untouched


def test_with_model_replaces_geminis_path_segment_quoted() -> None:
    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    new_path, new_body = wire.with_model("gemini", path, body, "odd model/2:x?y")
    assert new_path == "/v1beta/models/odd%20model%2F2%3Ax%3Fy:streamGenerateContent?alt=sse"
    assert wire.requested_model("gemini", new_path, new_body) == "odd model/2:x?y"
    assert wire.is_model_call(new_path)
    assert new_body == body and new_body is not body
    flash, _ = wire.with_model("gemini", path, body, "models/gemini-2.5-flash")
    assert flash == "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    with pytest.raises(ValueError):
        wire.with_model("gemini", "/v1/messages", body, "gemini-2.5-flash")


@pytest.mark.parametrize(
    ("status", "worthy"),
    [(500, True), (502, True), (503, True), (504, True), (529, True), (599, True),
     (501, False), (429, False), (400, False), (404, False), (200, False), (600, False)],
)  # fmt: skip
def test_fallback_worthy_is_a_server_fault_or_overload(status: int, worthy: bool) -> None:
    assert wire.fallback_worthy(status) is worthy


# --------------------------------------------------------------------------- streams
@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("answer", [_text, _tool], ids=["text", "tool"])
def test_a_whole_stream_counts_the_same_usage_in_every_api(api: wire.API, answer: Any) -> None:
    exchange = _meter(api, [_stream(api, answer())])
    assert _tokens(exchange) == FULL
    assert exchange.served_model == SERVED
    assert exchange.requested_model == ASKED
    assert exchange.complete
    assert (exchange.limit, exchange.error, exchange.status) == (None, None, 200)


@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_a_stream_split_at_any_one_boundary_counts_the_same(api: wire.API, line_end: bytes) -> None:
    data = _stream(api, _text()).replace(b"\n", line_end)
    whole = _meter(api, [data])
    assert _tokens(whole) == FULL and whole.complete
    for cut in range(len(data) + 1):
        assert _meter(api, [data[:cut], data[cut:]]) == whole, cut
    assert _meter(api, [data[i : i + 1] for i in range(len(data))]) == whole


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_stream_split_anywhere_counts_the_same(data: st.DataObject) -> None:
    api = data.draw(st.sampled_from(API_NAMES))
    line_end = data.draw(st.sampled_from([b"\n", b"\r\n"]))
    body = _stream(api, data.draw(st.sampled_from([_text, _tool]))()).replace(b"\n", line_end)
    chunks = data.draw(_chunkings(body))
    exchange = _meter(api, chunks)
    assert _tokens(exchange) == FULL
    assert exchange.served_model == SERVED and exchange.complete


@pytest.mark.parametrize(
    ("api", "tokens"),
    [
        # message_start's usage (its output_tokens 1) counts; the final message_delta never came
        ("anthropic", (USAGE.input_tokens, 1, USAGE.cached_input_tokens)),
        ("responses", (0, 0, 0)),  # usage comes only with response.completed
        ("chat", (0, 0, 0)),  # usage comes only in the last chunk
        ("gemini", FULL),  # every chunk carries the cumulative usage; none says it finished
    ],
)
def test_a_stream_cut_short_is_incomplete_but_what_it_said_counts(
    api: wire.API, tokens: tuple[int, int, int]
) -> None:
    data = _stream(api, _truncated())
    for cut in (len(data), len(data) - 7):  # at an event's end, and inside the last event
        exchange = _meter(api, [data[:cut]])
        assert _tokens(exchange) == tokens
        assert exchange.served_model == SERVED
        assert not exchange.complete


@pytest.mark.parametrize("api", API_NAMES)
def test_every_prefix_of_a_stream_counts_at_most_the_whole_and_complete_only_at_the_end(
    api: wire.API,
) -> None:
    data = _stream(api, _text())
    completed_at = None
    for cut in range(0, len(data) + 1, 3):
        exchange = _meter(api, [data[:cut]])
        assert all(seen <= full for seen, full in zip(_tokens(exchange), FULL, strict=True))
        if exchange.complete:
            assert _tokens(exchange) == FULL
            completed_at = cut if completed_at is None else completed_at
        else:
            assert completed_at is None, "complete once, complete for every longer prefix"
    assert completed_at is not None and completed_at > len(data) // 2


def test_a_chat_stream_without_include_usage_is_never_complete() -> None:
    chat = APIS["chat"]
    assert isinstance(chat, Chat)
    data = b"".join(chat.stream(_text(), include_usage=False))
    exchange = _meter("chat", [data])
    assert exchange.served_model == SERVED
    assert _tokens(exchange) == (0, 0, 0) and not exchange.complete


def test_an_event_whose_data_spans_several_lines_is_joined() -> None:
    frames = list(APIS["anthropic"].stream(_text()))
    start = json.loads(frames[0].split(b"data: ", 1)[1])
    lines = json.dumps(start, indent=1).splitlines()
    frames[0] = b"event: message_start\n" + b"".join(b"data: %s\n" % ln.encode() for ln in lines)
    frames[0] += b"\n"
    assert len(lines) > 10
    data = b"".join(frames)
    exchange = _meter("anthropic", [data])
    assert _tokens(exchange) == FULL and exchange.served_model == SERVED
    for cut in range(len(data) + 1):
        assert _meter("anthropic", [data[:cut], data[cut:]]) == exchange


def test_anthropic_message_delta_counts_replace_the_starts() -> None:
    """Anthropic's message_delta usage is cumulative and may name input counts too."""
    start = {
        "type": "message_start",
        "message": {
            "model": SERVED,
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": 50,
                      "cache_read_input_tokens": 40, "output_tokens": 1},
        },
    }  # fmt: skip
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": 7, "output_tokens": 90},
    }
    data = sse(start, "message_start") + sse(delta, "message_delta")
    exchange = _meter("anthropic", [data])
    # input: 7 uncached + 50 written to the cache + 40 read from it; cached: the 40 read
    assert _tokens(exchange) == (97, 90, 40) and exchange.complete


def test_gemini_counts_thoughts_as_output_and_tool_use_prompt_as_input() -> None:
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]},
                        "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 60,
                          "toolUsePromptTokenCount": 5, "candidatesTokenCount": 10,
                          "thoughtsTokenCount": 25, "totalTokenCount": 140},
        "modelVersion": "gemini-2.5-pro",
    }  # fmt: skip
    exchange = _meter("gemini", [sse(chunk)])
    assert _tokens(exchange) == (105, 35, 60)
    assert exchange.served_model == "gemini-2.5-pro" and exchange.complete


def test_openai_streams_with_usage_null_in_every_chunk_parse_only_what_counts() -> None:
    """OpenAI's include_usage puts ``"usage":null`` in every chunk but the last: the cheap
    test skips them, and the model, once known, is not looked for again."""
    frames = []
    for frame in APIS["chat"].stream(Answer(SERVED, ("word ",) * 300)):
        payload = frame.split(b"data: ", 1)[1].strip()
        if payload != b"[DONE]":
            chunk = json.loads(payload)
            chunk.setdefault("usage", None)
            frame = sse(chunk)
        frames.append(frame)
    meter = Meter("chat", 200, SSE, ASKED)
    for frame in frames:
        meter.feed(frame)
    assert _tokens(meter.finish()) == FULL
    assert meter._parsed == 2  # the first chunk (its model) and the usage chunk, of 304


@pytest.mark.parametrize("api", API_NAMES)
def test_text_deltas_are_not_parsed(api: wire.API) -> None:
    meter = Meter(api, 200, SSE, ASKED)
    for frame in APIS[api].stream(Answer(SERVED, ("word ",) * 500)):
        meter.feed(frame)
    exchange = meter.finish()
    assert _tokens(exchange) == FULL and exchange.complete
    # Anthropic: message_start and message_delta; Responses: response.created and
    # response.completed; Chat: the first chunk and the usage chunk; Gemini: each chunk
    # carries its cumulative usage.
    assert meter._parsed == (500 if api == "gemini" else 2)


# --------------------------------------------------------------------------- bounds
def _oversized_anthropic(text_bytes: int) -> list[bytes]:
    frames = list(APIS["anthropic"].stream(_text()))
    huge = sse(
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "x" * text_bytes}},
        "content_block_delta",
    )  # fmt: skip
    return [*frames[:4], huge, *frames[4:]]


@pytest.mark.parametrize("chunk_size", [64 * 1024, 3 * 1024 * 1024])
def test_a_2mib_line_is_skipped_without_being_held(chunk_size: int) -> None:
    data = b"".join(_oversized_anthropic(2 * 1024 * 1024))
    meter = Meter("anthropic", 200, SSE, ASKED)
    most = 0
    for at in range(0, len(data), chunk_size):
        meter.feed(data[at : at + chunk_size])
        most = max(most, meter.held_bytes)
    assert most <= MAX_LINE_BYTES
    assert meter.held_bytes < 1024, "past the long line, only short ones were held"
    exchange = meter.finish()
    assert _tokens(exchange) == FULL and exchange.complete


def test_a_skipped_events_end_is_found_when_its_crlf_is_split() -> None:
    """The blank line ending a skipped event may come as a "\r" at one chunk's end."""
    data = b"".join(_oversized_anthropic(1_500_000)).replace(b"\n", b"\r\n")
    meter = Meter("anthropic", 200, SSE, ASKED)
    for piece in data.split(b"\r"):
        meter.feed(piece + b"\r")
        assert meter.held_bytes <= MAX_LINE_BYTES
    exchange = meter.finish()
    assert _tokens(exchange) == FULL and exchange.complete


def test_lines_that_are_not_data_are_not_held() -> None:
    """A comment or ``event:`` line is known useless from its first five bytes."""
    comment = b": " + b"k" * 600_000 + b"\n\n"
    data = comment + _stream("anthropic", _text())
    meter = Meter("anthropic", 200, SSE, ASKED)
    for at in range(0, len(data), 4096):
        meter.feed(data[at : at + 4096])
        assert meter.held_bytes < 4096
    assert _tokens(meter.finish()) == FULL


def test_an_event_just_under_the_bound_is_read_and_just_over_is_skipped() -> None:
    def delta(pad: int) -> bytes:
        return sse(
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "pad": "p" * pad},
             "usage": {"output_tokens": 77}},
            "message_delta",
        )  # fmt: skip

    start = next(iter(APIS["anthropic"].stream(_text())))
    size = len(delta(0)) - 3  # the event's lines (event:, data:, blank), their "\n" excluded
    fits, over = delta(MAX_LINE_BYTES - size), delta(MAX_LINE_BYTES - size + 1)
    assert len(fits) - 3 == MAX_LINE_BYTES
    for frame, output, complete in ((fits, 77, True), (over, 1, False)):
        data = start + frame
        meter = Meter("anthropic", 200, SSE, ASKED)
        for at in range(0, len(data), 100_000):
            meter.feed(data[at : at + 100_000])
            assert meter.held_bytes <= MAX_LINE_BYTES
        exchange = meter.finish()
        assert (exchange.output_tokens, exchange.complete) == (output, complete)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_the_meter_never_holds_more_than_a_line_however_split(data: st.DataObject) -> None:
    body = b"".join(_oversized_anthropic(data.draw(st.sampled_from([900_000, 1_500_000]))))
    meter = Meter("anthropic", 200, SSE, ASKED)
    for chunk in data.draw(_chunkings(body)):
        meter.feed(chunk)
        assert meter.held_bytes <= MAX_LINE_BYTES
    assert _tokens(meter.finish()) == FULL


def test_a_json_body_over_the_bound_passes_unparsed() -> None:
    answer = Answer(SERVED, ("x" * (MAX_JSON_BYTES + 10),))
    data = json.dumps(APIS["anthropic"].complete(answer)).encode()
    meter = Meter("anthropic", 200, JSON, ASKED)
    for at in range(0, len(data), 256 * 1024):
        meter.feed(data[at : at + 256 * 1024])
        assert meter.held_bytes <= MAX_JSON_BYTES
    exchange = meter.finish()
    assert _tokens(exchange) == (0, 0, 0) and not exchange.complete
    assert meter.held_bytes == 0


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_a_compressed_body_is_not_parsed(encoding: str) -> None:
    data = gzip.compress(_stream("anthropic", _text()))
    headers = {**SSE, "content-encoding": encoding}
    meter = Meter("anthropic", 200, headers, ASKED)
    meter.feed(data)
    assert meter.held_bytes == 0
    exchange = meter.finish()
    assert _tokens(exchange) == (0, 0, 0) and not exchange.complete
    assert exchange.served_model is None


def test_identity_encoding_is_read() -> None:
    headers = {**SSE, "content-encoding": "identity"}
    assert _tokens(_meter("anthropic", [_stream("anthropic", _text())], headers=headers)) == FULL


# --------------------------------------------------------------------------- JSON bodies
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_json_body_counts_the_same_usage_however_split(data: st.DataObject) -> None:
    api = data.draw(st.sampled_from(API_NAMES))
    answer = data.draw(st.sampled_from([_text, _tool]))()
    body = json.dumps(APIS[api].complete(answer)).encode()
    exchange = _meter(api, data.draw(_chunkings(body)), headers=JSON)
    assert _tokens(exchange) == FULL
    assert exchange.served_model == SERVED and exchange.complete


def test_geminis_stream_as_a_json_array_is_read() -> None:
    """streamGenerateContent without ``alt=sse`` answers one JSON array of the chunks."""
    chunks = [
        json.loads(frame.split(b"data: ", 1)[1])
        for frame in APIS["gemini"].stream(Answer(SERVED, ("a", "b", "c")))
    ]
    body = json.dumps(chunks, indent=2).encode()
    exchange = _meter("gemini", [body[:100], body[100:]], headers=JSON)
    assert _tokens(exchange) == FULL and exchange.complete and exchange.served_model == SERVED


@pytest.mark.parametrize(("api", "kind"), [("anthropic", JSON), ("chat", SSE)])
def test_a_body_without_content_type_is_sniffed(api: wire.API, kind: dict[str, str]) -> None:
    body = (
        json.dumps(APIS[api].complete(_text())).encode() if kind is JSON else _stream(api, _text())
    )
    exchange = _meter(api, [b"", b"\n ", body], headers={})
    assert _tokens(exchange) == FULL and exchange.complete


def test_an_unknown_api_is_passed_unread() -> None:
    meter = Meter(None, 200, SSE, None)
    meter.feed(_stream("anthropic", _text()))
    exchange = meter.finish()
    assert exchange.api is None and _tokens(exchange) == (0, 0, 0) and not exchange.complete


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("api", API_NAMES)
@pytest.mark.parametrize(
    ("scenario", "limit"),
    [("http-429", "rate-limited"), ("quota", "quota"), ("http-401", None), ("http-500", None)],
)
def test_each_apis_errors_say_their_limit(api: wire.API, scenario: str, limit: str | None) -> None:
    reply = APIS[api].error(scenario)
    body = json.dumps(reply.body).encode()
    exchange = _meter(api, [body[:10], body[10:]], status=reply.status, headers=reply.headers)
    assert exchange.status == reply.status
    assert exchange.limit == limit
    assert exchange.error == reply.body["error"]["message"]
    assert exchange.retry_after_s == (RETRY_AFTER_S if scenario == "http-429" else None)
    assert not exchange.complete and _tokens(exchange) == (0, 0, 0)


@pytest.mark.parametrize(
    ("api", "retry_after"),
    [("anthropic", None), ("responses", RETRY_AFTER_S), ("chat", RETRY_AFTER_S),
     ("gemini", RETRY_AFTER_S)],
)  # fmt: skip
def test_without_a_retry_after_header_the_body_says_when(
    api: wire.API, retry_after: int | None
) -> None:
    """OpenAI says "try again in 7s", Gemini's RetryInfo ``"retryDelay": "7s"``."""
    reply = APIS[api].error("http-429")
    exchange = _meter(api, [json.dumps(reply.body).encode()], status=429, headers=JSON)
    assert exchange.limit == "rate-limited"
    assert exchange.retry_after_s == retry_after


@pytest.mark.parametrize("api", API_NAMES)
def test_a_limit_that_ends_announces_its_reset(api: wire.API) -> None:
    reply = limited_reply(Windows(), APIS[api], "[limited:http-429:1:k]")
    assert reply is not None
    exchange = _meter(api, [json.dumps(reply.body).encode()], status=429, headers=reply.headers)
    assert (exchange.limit, exchange.retry_after_s) == ("rate-limited", RESET_S)


def test_anthropic_529_and_an_overloaded_5xx_are_overloaded() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    exchange = _meter("anthropic", [json.dumps(overloaded).encode()], status=529, headers=JSON)
    assert (exchange.limit, exchange.error) == ("overloaded", "Overloaded")
    gemini = {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",
                        "status": "UNAVAILABLE"}}  # fmt: skip
    exchange = _meter("gemini", [json.dumps(gemini).encode()], status=503, headers=JSON)
    assert exchange.limit == "overloaded"
    assert _meter("anthropic", [b"<html>bad gateway</html>"], status=502).limit is None


def test_geminis_stream_error_comes_as_an_array() -> None:
    reply = APIS["gemini"].error("quota")
    exchange = _meter("gemini", [json.dumps([reply.body]).encode()], status=429, headers=JSON)
    assert exchange.limit == "quota"
    assert exchange.error == reply.body["error"]["message"]


def test_an_error_body_is_read_only_so_far_and_its_message_truncated() -> None:
    body = b"upstream says: " + b"e" * (2 * 1024 * 1024)
    meter = Meter("chat", 500, {"content-type": "text/plain"}, ASKED)
    for at in range(0, len(body), 4096):
        meter.feed(body[at : at + 4096])
        assert meter.held_bytes <= wire.ERROR_BODY_BYTES
    exchange = meter.finish()
    assert exchange.error is not None and len(exchange.error) == 500
    assert exchange.error.startswith("upstream says: eee")


def test_a_compressed_error_is_classified_by_its_status() -> None:
    headers = {**JSON, "content-encoding": "gzip", "retry-after": "3"}
    exchange = _meter(
        "chat", [gzip.compress(b'{"error":{"message":"x"}}')], status=429, headers=headers
    )
    assert (exchange.limit, exchange.retry_after_s, exchange.error) == ("rate-limited", 3.0, None)


def test_retry_after_from_headers_and_text() -> None:
    assert wire.retry_after_from({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert wire.retry_after_from({"retry-after": "12"}) == 12.0
    assert wire.retry_after_from({"retry-after": "-4"}) == 0.0
    date = formatdate(1_000_030, usegmt=True)
    assert wire.retry_after_from({"retry-after": date}, now=1_000_000) == 30.0
    assert wire.retry_after_from({"retry-after": date}, now=1_000_100) == 0.0
    assert wire.retry_after_from({"retry-after": "soon"}, '"retryDelay": "12s"') == 12.0
    assert wire.retry_after_from({"retry-after-ms": "nan"}) is None
    assert wire.retry_after_from({}) is None


def test_an_error_event_inside_a_stream_is_reported() -> None:
    """Anthropic can answer 200 and then send ``event: error`` mid-stream."""
    first = next(iter(APIS["anthropic"].stream(_text())))
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    exchange = _meter("anthropic", [first + sse(error, "error")])
    assert (exchange.status, exchange.limit, exchange.error) == (200, "overloaded", "Overloaded")
    assert exchange.input_tokens == USAGE.input_tokens and not exchange.complete


def test_a_responses_stream_that_fails_says_why() -> None:
    failed = {
        "type": "response.failed",
        "response": {"id": "resp_1", "status": "failed", "model": SERVED, "usage": None,
                     "error": {"code": "rate_limit_exceeded",
                               "message": "Rate limit reached. Please try again in 2s."}},
    }  # fmt: skip
    exchange = _meter("responses", [sse(failed, "response.failed")])
    assert exchange.limit == "rate-limited" and exchange.retry_after_s == 2.0
    assert exchange.error == "Rate limit reached. Please try again in 2s."
    assert exchange.served_model == SERVED and not exchange.complete
