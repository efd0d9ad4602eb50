"""The stream rules, written once for every harness.

Bytes from the harness's stdout become lines (CRLF tolerant, invalid UTF-8 replaced, a line
over ``max_line_bytes`` dropped and counted without ever being held whole), lines become JSON
messages (blank lines skipped, non-JSON lines counted and skipped: banners are normal),
messages go through the adapter's ``map_message`` (an exception there is caught and
counted), and the result is a turn whose first event is ``turn-started`` and whose last is its
one terminal event. Lines after the terminal are dropped and counted. A stream that ends
without a terminal gets one from the adapter's ``finish`` or, failing that, a ``session-error``
of reason ``exit`` built from the exit code and the stderr tail. With
:attr:`StreamDriver.coalesce_chars` set, consecutive ``assistant-text`` is merged into fewer
events (released before the next event of another type, and whenever the caller has fed what
it read: nothing waits for more output).

Pure: no I/O, no clock. The worker reads the process and feeds bytes in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
        lines = self._splitter.feed(chunk)
        if len(lines) > 1:
            self._many(lines, out)
        elif lines:
            self._line(lines[0], out)
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

    def _many(self, lines: list[bytes], out: list[Event]) -> None:
        """:meth:`_line` for each line, with the lookups done once: a flood of small lines
        is the hot path (rows 2 and 6 of docs/performance.md)."""
        counters = self.counters
        map_message, state, accept = self.adapter.map_message, self.state, self._accept
        text_of, hold, held, bound = self._text_of, self._hold_text, self._text, self.coalesce_chars
        loads = orjson.loads
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw or raw.isspace():
                continue
            counters.lines += 1
            if self.terminal is not None:
                counters.dropped_after_terminal += 1
                continue
            try:
                message = loads(raw)  # _parse_json, its first try inlined
            except orjson.JSONDecodeError:
                try:
                    message = _parse_json(raw)
                except (ValueError, RecursionError):
                    counters.non_json += 1
                    continue
            if not isinstance(message, dict):
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
            except Exception as exc:  # noqa: BLE001 -- as in _line
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
        for line in self._splitter.flush():
            self._line(line, out)
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

    def _line(self, raw: bytes, out: list[Event]) -> None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw or raw.isspace():
            return
        self.counters.lines += 1
        if self.done:
            self.counters.dropped_after_terminal += 1
            return
        try:
            message = _parse_json(raw)
        except (ValueError, RecursionError):
            self.counters.non_json += 1
            return
        if not isinstance(message, dict):
            self.counters.non_json += 1
            return
        self.counters.messages += 1
        try:
            events = self.adapter.map_message(message, self.state)
        except Exception as exc:  # noqa: BLE001 -- one bad message is counted data, not a failed turn
            self.counters.mapper_errors += 1
            self.last_mapper_error = f"{type(exc).__name__}: {exc}"
            return
        self._accept(events, out)

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
