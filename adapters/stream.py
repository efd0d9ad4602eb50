"""The stream rules, written once for every harness.

Bytes from the harness's stdout become lines (CRLF tolerant, invalid UTF-8 replaced, a line
over ``max_line_bytes`` dropped and counted without ever being held whole), lines become JSON
messages (blank lines skipped, non-JSON lines counted and skipped: banners are normal; a
chunk's complete lines parsed as one JSON array when each is one document, the same messages
for one parse: :meth:`StreamDriver._block`), messages go through the adapter's
``map_message`` (an exception there is caught and counted), and the result is a turn whose
first event is ``turn-started`` and whose last is its one terminal event. Lines after the
terminal are dropped and counted. A stream that ends without a terminal gets one from the
adapter's ``finish`` or, failing that, a ``session-error`` of reason ``exit`` built from the
exit code and the stderr tail. With :attr:`StreamDriver.coalesce_chars` set, consecutive
``assistant-text`` is merged into fewer events (released before the next event of another
type, and whenever the caller has fed what it read: nothing waits for more output).

Pure: no I/O, no clock. The worker reads the process and feeds bytes in.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, cast

import orjson

from adapters.events import (
    TERMINAL_TYPES,
    AssistantText,
    Event,
    Session,
    SessionError,
    TurnComplete,
    TurnStarted,
    session_error,
)
from adapters.protocol import AdapterState, ExitInfo, Mode, TextMessages, TurnRequest

DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
_ACCEPT_RULES = TERMINAL_TYPES | {"turn-started", "session"}
"""Event types that :meth:`StreamDriver._accept` does more with than append and count."""
_decode_json = json.JSONDecoder().decode  # json.loads without its per-call dispatch
STDERR_TAIL_CHARS = 2000
BLOCK_PAUSE = 64
"""Chunks fed line by line after one whose lines did not parse as one block
(:meth:`StreamDriver._block`)."""
LONG_LINE_BYTES = 256
"""Lines at least this long on average are found one at a time by :func:`_holds_lines`."""
_NOT_JSON = object()
"""A line that is not JSON, in :meth:`StreamDriver._messages`."""


class LineSplitter:
    """Splits a byte stream into lines, never buffering more than ``max_line_bytes``."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.oversized = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._discarding = False

    def feed(self, chunk: bytes) -> list[bytes]:
        # bytes.split does the scanning in C: a flood of small lines is the hot path.
        pieces = chunk.split(b"\n")
        rest = pieces.pop()
        if not pieces:
            self._hold(rest)
            return []
        limit = self.max_line_bytes
        head: bytes | None = pieces[0]
        if self._discarding:  # the tail of a line already dropped
            self._discarding = False
            head = None
        elif self._parts:  # the end of a line begun in an earlier chunk
            if self._size + len(pieces[0]) > limit:
                self._drop()
                head = None
            else:
                self._parts.append(pieces[0])
                head = b"".join(self._parts)
                self._parts.clear()
                self._size = 0
        candidates = pieces[1:] if head is None else [head, *pieces[1:]]
        lines = [line for line in candidates if len(line) <= limit]
        self.oversized += len(candidates) - len(lines)
        self._hold(rest)
        return lines

    def whole_lines(self, chunk: bytes) -> bytes | None:
        """The two or more complete lines this chunk ends, as one block joined by their
        newlines (the block's own last newline left off), the rest held as :meth:`feed`
        holds it. None, having taken nothing, when the chunk ends fewer than two lines or
        the block could hold a line over the limit: :meth:`feed` takes it then."""
        last = chunk.rfind(b"\n")
        if (
            self._discarding
            or self._size + len(chunk) > self.max_line_bytes
            or chunk.find(b"\n", 0, last) < 0
        ):
            return None
        if self._parts:  # the end of a line begun in an earlier chunk
            block = b"".join((*self._parts, memoryview(chunk)[:last]))
            self._parts.clear()
            self._size = 0
        else:
            block = chunk[:last]
        self._hold(chunk[last + 1 :])
        return block

    def flush(self) -> list[bytes]:
        """The last line when the stream ends without a newline."""
        if self._discarding or not self._parts:
            self._parts.clear()
            self._size = 0
            self._discarding = False
            return []
        line = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        return [line]

    def _hold(self, rest: bytes) -> None:
        if not rest or self._discarding:
            return
        if self._size + len(rest) > self.max_line_bytes:
            self._drop()
            self._discarding = True
            return
        self._parts.append(rest)
        self._size += len(rest)

    def _drop(self) -> None:
        self.oversized += 1
        self._parts.clear()
        self._size = 0


def _parse_json(raw: bytes) -> Any:
    """One JSON document from a line's bytes.

    orjson first (several times faster than ``json``; this runs once per harness line). What
    it refuses goes to ``json``, which is more lenient, so a line means what it always meant:
    invalid UTF-8 is replaced rather than fatal, an escaped lone surrogate is kept (the
    publisher replaces it), ``NaN`` is accepted. One difference remains: an integer beyond
    64 bits becomes a float (no harness counts tokens past 2**64). Nesting too deep for
    either parser is not JSON to us (``RecursionError``, caught by the caller, like
    ``ValueError``).
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_json(raw.decode("utf-8", errors="replace"))


def _holds_lines(block: bytes, count: int) -> bool:
    """Whether ``block`` holds exactly ``count`` lines. Where lines are long, found one at a
    time (memchr skips a line at once); where short, counted (bytes.count reads every byte)."""
    if len(block) < LONG_LINE_BYTES * count:
        return block.count(b"\n") == count - 1
    find, at = block.find, -1
    for _ in range(count - 1):
        at = find(b"\n", at + 1)
        if at < 0:
            return False
    return find(b"\n", at + 1) < 0


@dataclass
class StreamCounters:
    lines: int = 0
    messages: int = 0
    non_json: int = 0
    mapper_errors: int = 0
    dropped_after_terminal: int = 0
    oversized: int = 0
    events: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class StreamDriver:
    """Runs one turn's output through an adapter under the shared stream rules. ``state`` is
    the adapter's own (an :class:`AdapterState`), read by the worker once the turn is over."""

    adapter: Mode[Any]
    request: TurnRequest
    attempt: int = 1
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    coalesce_chars: int = 0
    """Consecutive ``assistant-text`` held and released as one event of up to this many
    characters (a longer single text stays whole): released before the next event of another
    type, before the terminal, and by :meth:`release_text`, which the caller calls once it has
    fed what it read. 0: one event per message. A gigabyte of 1 KiB lines is then ~30,000
    stream entries instead of a million (docs/performance.md, row 6)."""
    counters: StreamCounters = field(default_factory=StreamCounters)
    terminal: Event | None = None
    last_mapper_error: str | None = None

    def __post_init__(self) -> None:
        self.state: AdapterState = self.adapter.new_state(self.request)
        # docs/events.md: ``model`` is the model the harness reports it used. An adapter whose
        # harness only echoes the model it was asked for (capability model_reporting false)
        # names none, whatever its mapper found.
        self._drop_model = not self.adapter.CAPABILITIES.model_reporting
        self._splitter = LineSplitter(self.max_line_bytes)
        self._started = False
        self._text: list[str] = []
        """Held text (:attr:`coalesce_chars`), oldest first."""
        self._text_chars = 0
        self._block_pause = 0
        """Chunks still to go line by line after a block that did not parse whole."""
        # A text line read without an event of its own (adapters.protocol.TextMessages).
        self._text_of: Callable[[dict[str, Any]], str | None] | None = None
        if self.coalesce_chars and isinstance(self.adapter, TextMessages):
            self._text_of = self.adapter.text_message

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def start(self) -> list[Event]:
        """The turn's first event. Call once, before anything else."""
        if self._started:
            return []
        self._started = True
        return [
            TurnStarted(
                harness=self.adapter.HARNESS_ID,
                attempt=self.attempt,
                input_chars=len(self.request.input),
            )
        ]

    def feed(self, chunk: bytes) -> list[Event]:
        """Map a chunk of stdout; returns the events it completes, in order."""
        out = self.start()
        if self._block_pause:
            self._block_pause -= 1
        else:
            block = self._splitter.whole_lines(chunk)
            if block is not None:
                self._block(block, out)
                return out
        lines = self._splitter.feed(chunk)
        if lines:
            self._many(lines, out)
        self.counters.oversized = self._splitter.oversized
        return out

    def release_text(self) -> list[Event]:
        """The text held so far (:attr:`coalesce_chars`), as one event; empty when none is."""
        out: list[Event] = []
        if self._text:
            self._release_text(out)
        return out

    def _hold_text(self, text: str, out: list[Event]) -> None:
        if self._text and self._text_chars + len(text) > self.coalesce_chars:
            self._release_text(out)
        self._text.append(text)
        self._text_chars += len(text)

    def _release_text(self, out: list[Event]) -> None:
        held = self._text
        out.append(AssistantText(text=held[0] if len(held) == 1 else "".join(held)))
        self.counters.events += 1
        held.clear()
        self._text_chars = 0

    def _all_text(self, values: list[Any], out: list[Event]) -> bool:
        """Hold every value's text when all are text messages (:attr:`coalesce_chars`), as
        :meth:`_hold_text` one at a time would, each run of texts that fits taken at once;
        False, having held nothing, when one is not."""
        text_of = self._text_of
        if text_of is None or set(map(type, values)) != {dict}:
            return False
        found = list(map(text_of, values))
        if None in found:
            return False
        texts = cast("list[str]", found)
        held, bound = self._text, self.coalesce_chars
        ends = list(accumulate(map(len, texts)))  # ends[j]: the chars of texts[: j + 1]
        at, count = 0, len(texts)
        while at < count:
            before = ends[at - 1] if at else 0
            upto = bisect_right(ends, before + bound - self._text_chars, at)
            if upto == at:  # texts[at] does not fit beside what is held
                if held:
                    self._release_text(out)
                    continue
                upto = at + 1  # a text longer than the bound stays whole
            held.extend(filter(None, texts[at:upto]))
            self._text_chars += ends[upto - 1] - before
            at = upto
        return True

    def _block(self, block: bytes, out: list[Event]) -> None:
        """Complete lines (:meth:`LineSplitter.whole_lines`) parsed as one JSON array, their
        newlines made its commas: one orjson call in place of a split and a call per line,
        the flood's hot path (row 6 of docs/performance.md). A block that does not parse to
        exactly one value per line (a blank line, a banner, JSON orjson refuses, a document
        over several lines) goes line by line, as do the next :data:`BLOCK_PAUSE` chunks, so
        a harness whose output seldom parses whole does not pay twice for it.

        Each value is then its line's, as line by line, for every output whose lines are
        each one JSON document. Lines that are not could only be crafted to parse as the
        values their text joins to; those are documents the harness could print on lines of
        their own, so it gains nothing by it. Pretty-printed JSON never parses so: a line
        break after ``{``, ``[``, ``:`` or ``,`` makes the array invalid."""
        try:
            values = orjson.loads(b"".join((b"[", block.replace(b"\n", b","), b"]")))
        except orjson.JSONDecodeError:
            values = None
        if values is None or not _holds_lines(block, len(values)):
            self._block_pause = BLOCK_PAUSE
            self._many(block.split(b"\n"), out)
            return
        self._messages(values, out)

    def _many(self, lines: list[bytes], out: list[Event]) -> None:
        """Lines parsed one at a time (blank ones skipped), then :meth:`_messages`."""
        if self.terminal is not None:  # all of it after the terminal: nothing to parse
            counted = [raw for raw in lines if raw.strip()]
            self.counters.lines += len(counted)
            self.counters.dropped_after_terminal += len(counted)
            return
        values: list[Any] = []
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw or raw.isspace():
                continue
            try:
                values.append(_parse_json(raw))
            except (ValueError, RecursionError):  # orjson's JSONDecodeError is a ValueError
                values.append(_NOT_JSON)
        self._messages(values, out)

    def _messages(self, values: list[Any], out: list[Event]) -> None:
        """Each line's JSON value through the adapter, with the lookups done once: a flood
        of small lines is the hot path (rows 2 and 6 of docs/performance.md)."""
        counters = self.counters
        counters.lines += len(values)
        if self._text_of is not None and self.terminal is None and self._all_text(values, out):
            counters.messages += len(values)
            return
        map_message, state, accept = self.adapter.map_message, self.state, self._accept
        text_of, hold, held, bound = self._text_of, self._hold_text, self._text, self.coalesce_chars
        for message in values:
            if self.terminal is not None:
                counters.dropped_after_terminal += 1
                continue
            if not isinstance(message, dict):  # _NOT_JSON too
                counters.non_json += 1
                continue
            counters.messages += 1
            if text_of is not None:
                text = text_of(message)
                if text is not None:  # a text line: held, no event made for it
                    if text:  # _hold_text, inlined
                        if held and self._text_chars + len(text) > bound:
                            self._release_text(out)
                        held.append(text)
                        self._text_chars += len(text)
                    continue
            try:
                events = map_message(message, state)
            except Exception as exc:  # noqa: BLE001 -- one bad message is counted data, not a failed turn
                counters.mapper_errors += 1
                self.last_mapper_error = f"{type(exc).__name__}: {exc}"
                continue
            if len(events) == 1 and events[0].type not in _ACCEPT_RULES and not self._text:
                # One plain event (no terminal yet, no text held): what _accept would do.
                event = events[0]
                if self.coalesce_chars and type(event) is AssistantText:
                    hold(event.text, out)
                    continue
                out.append(event)
                counters.events += 1
                continue
            accept(events, out)

    def finish(self, exit: ExitInfo) -> list[Event]:
        """The process has exited: flush, then make sure the turn has its terminal event."""
        out = self.start()
        self._many(self._splitter.flush(), out)
        self.counters.oversized = self._splitter.oversized
        if self.done:
            return out
        try:
            tail_events = self.adapter.finish(self.state, exit)
        except Exception as exc:  # noqa: BLE001 -- an adapter bug must not cost the turn its terminal
            self.counters.mapper_errors += 1
            self.last_mapper_error = f"{type(exc).__name__}: {exc}"
            tail_events = []
        self._accept(tail_events, out)
        if not self.done:
            self._accept([self._exit_error(exit)], out)
        return out

    def fail(self, error: SessionError) -> list[Event]:
        """End the turn from outside (timeout, cancel, shutdown, sandbox failure).

        Returns nothing when the turn already has its terminal event.
        """
        out = self.start()
        if not self.done:
            self._accept([error], out)
        return out

    def _accept(self, events: list[Event], out: list[Event]) -> None:
        for event in events:
            if self.terminal is not None:
                self.counters.dropped_after_terminal += 1
                continue
            kind = event.type
            if kind == "turn-started":
                continue
            if self.coalesce_chars and type(event) is AssistantText:
                self._hold_text(event.text, out)
                continue
            if self._text:
                self._release_text(out)
            if self._drop_model and isinstance(event, Session | TurnComplete) and event.model:
                event = event.model_copy(update={"model": None})
            out.append(event)
            self.counters.events += 1
            if kind in TERMINAL_TYPES:
                self.terminal = event

    def _exit_error(self, exit: ExitInfo) -> SessionError:
        code = "unknown" if exit.exit_code is None else str(exit.exit_code)
        tail = exit.stderr_tail[-STDERR_TAIL_CHARS:]
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no output on stderr"
        return session_error(
            f"{self.adapter.HARNESS_ID} exited (code {code}) without a final message: {detail}",
            "exit",
            exit_code=exit.exit_code,
            stderr_tail=tail,
        )
