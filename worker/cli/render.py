"""How the ``harness`` command shows events: for a person, or one JSON object per line.

``--json`` writes exactly one JSON object per line on stdout and nothing else (no colour, no
spinner, no summary). For a person, output goes through rich: assistant text as it arrives,
tool activity as one compact line each, a spinner while the harness thinks (only on a
terminal), and a closing line per turn (status, duration, tokens, cost, model, session id).
Colour and the spinner appear only when stdout is a terminal (rich also honours ``NO_COLOR``
and ``FORCE_COLOR``); piped output is plain text, one line per item, never wrapped.

Notices (a turn waiting for a worker, an end waiting for its teardown) go to stderr for a
person, as ``harness: ...`` lines, and to stdout as JSON objects with a ``notice`` key with
``--json`` (after the first line, the run id or accepted line, as always). A Redis outage
while following is said on stderr in both modes.

Text from the harness is data, never markup: it is printed as :class:`rich.text.Text`, with
control characters (escape sequences a harness could print) shown as visible symbols.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from adapters.events import TERMINAL_TYPES
from worker.store.records import RunRecord

SPINNER_DELAY_S = 0.3
"""Wait this long without output before showing the spinner (a quick command never shows
one, and a non-follow command exits before it would start)."""

DELTA_HARNESSES = frozenset({"gemini"})
"""Harnesses whose ``assistant-text`` events are pieces of one message (Gemini CLI's
stream-json ``message`` lines are deltas, see adapters/gemini.py), joined as they arrive.
Every other harness sends whole text blocks, each ending its own line."""

ACTIVITY_MARKS = {"command": "$", "file": "✎", "tool": "⚙", "network": "⊘", "other": "·"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode "control picture": ␛ for ESC, ␇ for BEL
    return "\u2421" if code == 0x7F else "\ufffd"


def clean(text: str) -> str:
    """Harness text made safe for a terminal: CRLF becomes LF, other controls visible."""
    return _CONTROL.sub(_visible, text.replace("\r\n", "\n"))


def one_line(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (for compact activity lines)."""
    first, _, rest = text.strip().partition("\n")
    if rest.strip():
        first += " …"
    return first if len(first) <= limit else first[: limit - 1] + "…"


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_cost(cost: float | None) -> str:
    if cost is None:
        return "cost n/a"
    if cost == 0:
        return "$0.00"
    return f"${cost:.4f}" if cost >= 0.01 else f"${cost:.6f}"


def format_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def format_since(ts: float, now: float | None = None) -> str:
    """A past moment for a person: local clock time (with the date if not today) and age."""
    now = time.time() if now is None else now
    same_day = time.localtime(ts)[:3] == time.localtime(now)[:3]
    clock = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{clock} ({format_duration(max(0.0, now - ts))} ago)"


def waiting_text(notice: dict[str, Any], now: float | None = None) -> str:
    """A :class:`worker.client.reading.Waiting` notice (as its dict) in a sentence."""
    text = f"waiting for a worker on {notice['queue']}"
    if isinstance(notice.get("since"), int | float):
        text += f" since {format_since(float(notice['since']), now)}"
    text += ": no live worker consumes that queue; "
    bound = notice.get("bound_s")
    if isinstance(bound, int | float):
        return text + (
            f"the turn waits up to {bound:g} s for a worker there, then ends with a sandbox "
            "error (the run stays usable)"
        )
    return text + "the turn stays queued until one starts"


def slot_text(notice: dict[str, Any], now: float | None = None) -> str:
    """A :class:`worker.spend.slots.SlotWaiting` notice (as its dict) in a sentence."""
    text = (
        f"waiting for a slot of {notice['grant']} (at most {notice['limit']} turns at once "
        f"on that key): place {notice['place']} of {notice['waiting']} waiting"
    )
    if isinstance(notice.get("since"), int | float):
        text += f", since {format_since(float(notice['since']), now)}"
    return text


def parked_text(data: dict[str, Any], now: float | None = None) -> str:
    """A ``parked`` event in a sentence."""
    resume = data.get("resume_at")
    when = "later"
    if isinstance(resume, int | float):
        now = time.time() if now is None else now
        clock = time.strftime("%H:%M:%S", time.localtime(resume))
        when = f"{clock} (in {format_duration(max(0.0, resume - now))})"
    return (
        f"parked ({data.get('reason')}): the worker sends this input again as turn "
        f"{data.get('next_turn')} at {when}"
    )


def workspace_text(data: dict[str, Any]) -> str:
    """A ``workspace`` event on one line: what changed, or the rewind it records."""
    counts = [
        f"{data.get(f'{what}_count', 0)} {what}"
        for what in ("added", "modified", "deleted")
        if data.get(f"{what}_count")
    ]
    lines = f"+{data.get('lines_added', 0)} -{data.get('lines_removed', 0)} lines"
    changed = ", ".join(counts) + f" ({lines})" if counts else "no change"
    snapshot = str(data.get("snapshot") or "")[:12] or "none"
    if data.get("rewound_to") is not None:
        text = f"workspace rewound to turn {data['rewound_to']}: {changed}"
    else:
        text = f"workspace: {changed}"
    text += f" · snapshot {snapshot}"
    if data.get("pushed_branch"):
        text += f" · pushed to {data['pushed_branch']}"
    if data.get("note"):
        text += f" · {one_line(str(data['note']))}"
    return text


def teardown_text(notice: dict[str, Any]) -> str:
    """The notice of an ``end`` that waits for a worker to tear the run down."""
    text = f"waiting for a worker on {notice['queue']} to tear the run down… "
    text += f"(up to {float(notice['timeout_s']):g}s"
    if not notice.get("alive"):
        text += "; no live worker consumes that queue now: after that the run is ended here "
        text += "and the reaper removes its sandbox"
    return text + ")"


@dataclass
class TurnView:
    """What the renderer has seen of one turn: enough for its closing line."""

    number: int
    harness: str = ""
    started_ts: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    usage_seen: bool = False
    model: str | None = None
    session_id: str | None = None
    streamed: list[str] = field(default_factory=list)
    activities: int = 0

    def add_usage(self, data: dict[str, Any]) -> None:
        self.usage_seen = True
        self.input_tokens += int(data.get("input_tokens") or 0)
        self.output_tokens += int(data.get("output_tokens") or 0)
        cost = data.get("cost_usd")
        if isinstance(cost, int | float):
            self.cost_usd = (self.cost_usd or 0.0) + float(cost)

    def close(self, data: dict[str, Any], ts: float) -> dict[str, Any]:
        """The facts of the closing line, from what was streamed and the terminal event."""
        if not self.usage_seen:
            self.input_tokens = int(data.get("input_tokens") or 0)
            self.output_tokens = int(data.get("output_tokens") or 0)
            cost = data.get("cost_usd")
            self.cost_usd = float(cost) if isinstance(cost, int | float) else None
        return {
            "duration_s": None if self.started_ts is None else max(0.0, ts - self.started_ts),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "model": data.get("model") or self.model,
            "session_id": data.get("session_id") or self.session_id,
        }


class Renderer:
    """Prints what the ``harness`` command has to say. One instance per command."""

    def __init__(
        self,
        json_output: bool,
        stream: TextIO | None = None,
        *,
        terminal: bool | None = None,
        width: int | None = None,
        err: TextIO | None = None,
    ) -> None:
        """``terminal`` forces (True) or forbids (False) terminal behaviour, colour and
        spinner included; None decides from the stream, as rich does. ``err`` (default
        stderr) takes a person's notices."""
        self.json = json_output
        self.out = stream or sys.stdout
        self.err = err or sys.stderr
        self.console = Console(
            file=self.out,
            force_terminal=terminal,
            soft_wrap=True,
            highlight=False,
            markup=False,
            emoji=False,
            width=width,
        )
        self.interactive = not json_output and self.console.is_terminal and terminal is not False
        self.turn: TurnView | None = None
        self._at_line_start = True
        self._spinner = _SpinnerSlot(self.console) if self.interactive else None

    # -- output primitives ----------------------------------------------------------------

    def _line(self, text: str) -> None:
        """A raw line (JSON mode): nothing but the text and a newline."""
        self.out.write(text + "\n")
        self.out.flush()

    def _print(self, *parts: Text | Table | str) -> None:
        self._end_text()
        self.console.print(*parts)
        self.out.flush()

    def _end_text(self) -> None:
        if not self._at_line_start:
            self.console.print()
            self._at_line_start = True

    def close(self) -> None:
        """Stop the spinner (also registered to run at exit)."""
        if self._spinner is not None:
            self._spinner.stop()
        self._end_text()

    # -- the interface worker/cli/main.py uses -------------------------------------------------

    run_id: str | None = None
    """The run being followed, for the answer commands shown with a permission request."""

    def accepted(self, run_id: str, turn: int) -> None:
        self.run_id = run_id
        if self.json:
            self._line(json.dumps({"run_id": run_id, "turn": turn}))
            return
        # The first line is the run id alone (scripts read it); colour only decorates.
        text = Text(run_id, style="bold")
        if turn > 1:
            text.append(f" turn {turn}", style="dim")
        self._print(text)
        self._wait("waiting for a worker")

    def message(self, payload: dict[str, Any], text: str) -> None:
        if self.json:
            self._line(json.dumps(payload))
        else:
            self._print(Text(text))

    def notice(self, notice: dict[str, Any]) -> None:
        """A waiting notice (of :meth:`worker.client.harness.HarnessClient.follow` or ``end``)."""
        if self.json:
            self._line(json.dumps(notice))
            return
        if self._spinner is not None:
            self._spinner.stop()  # it draws on the terminal stderr shares
        self._end_text()
        teardown = notice.get("for") == "teardown"
        if notice.get("for") == "slot":
            self._say(slot_text(notice))
            self._wait(f"waiting for a slot of {notice['grant']}")
            return
        self._say(teardown_text(notice) if teardown else waiting_text(notice))
        if not teardown:
            self._wait(f"waiting for a worker on {notice['queue']}")

    def outage(self, error: str) -> None:
        """Redis went away while following (said on stderr in both modes)."""
        if self._spinner is not None:
            self._spinner.stop()
        self._end_text()
        self._say(f"Redis is unreachable; retrying… ({error})")

    def lost(self, run_id: str, after: str | None) -> None:
        """The followed run is gone from Redis (``StreamLost``): the follow stops. With --json
        a ``{"notice": "lost", ...}`` line; the reason goes to stderr as every error's does."""
        self.close()
        if self.json:
            self._line(json.dumps({"notice": "lost", "run_id": run_id, "after": after}))

    def recovered(self, after: str | None) -> None:
        where = f"after {after}" if after else "from the start"
        self._say(f"Redis is back; resuming {where}")

    def _say(self, text: str) -> None:
        self.err.write(f"harness: {text}\n")
        self.err.flush()

    def record(self, record: dict[str, Any], now: float | None = None) -> None:
        """A run record (``harness status``): typed JSON, or :func:`record_rows` for a person."""
        if self.json:
            self._line(json.dumps(record))
            return
        rows = record_rows(record, now)
        if not self.interactive:
            width = max((len(k) for k, _ in rows), default=0)
            for key, value in rows:
                first, *rest = value.split("\n")
                self._line(f"{key:<{width}}  {first}".rstrip())
                for line in rest:
                    self._line(f"{'':<{width}}  {line}")
            return
        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in rows:
            style = _STATUS_STYLE.get(value, "") if key == "status" else ""
            table.add_row(key, Text(value, style=style))
        self._print(table)

    def event(self, event: Any) -> None:
        if self.json:
            self._line(json.dumps(event.as_dict(), ensure_ascii=False))
            return
        view = self._view(event)
        show = _EVENT_VIEWS.get(event.type)
        if show is None:  # a type newer than this renderer: show it rather than hide it
            text = f"{event.type} {json.dumps(event.data, ensure_ascii=False)}"
            self._print(Text(text, style="dim"))
            return
        show(self, event, view)

    def _turn_started(self, event: Any, view: TurnView) -> None:
        data = event.data
        view.harness = str(data.get("harness") or "")
        view.started_ts = event.ts
        attempt = int(data.get("attempt") or 1)
        title = Text(f"── turn {event.turn}", style="bold cyan")
        title.append(f" · {view.harness}", style="cyan")
        if attempt > 1:
            title.append(f" · attempt {attempt}", style="yellow")
        title.append(" ──", style="bold cyan")
        self._print(title)
        self._wait("thinking")

    def _session(self, event: Any, view: TurnView) -> None:
        data = event.data
        view.session_id = data.get("session_id") or view.session_id
        view.model = data.get("model") or view.model
        line = Text(f"● session {data.get('session_id')}", style="dim")
        if data.get("resumed"):
            line.append(" (resumed)", style="dim green")
        line.append(f" · {data.get('model') or 'model not reported'}", style="dim")
        self._print(line)
        self._wait("thinking")

    def _assistant_text(self, event: Any, view: TurnView) -> None:
        self._text(view, str(event.data.get("text", "")))
        self._wait("thinking")

    def _activity(self, event: Any, view: TurnView) -> None:
        data = event.data
        view.activities += 1
        mark = ACTIVITY_MARKS.get(str(data.get("kind")), "·")
        description = one_line(clean(str(data.get("description", ""))))
        line = Text(f"  {mark} ", style="bold blue")
        line.append(description, style="blue")
        self._print(line)
        self._wait("working")

    def _permission_request(self, event: Any, view: TurnView) -> None:
        data = event.data
        line = Text("  ? permission: ", style="bold yellow")
        line.append(clean(str(data.get("description") or "")), style="yellow")
        if data.get("command"):
            line.append(f"  {one_line(clean(str(data['command'])))}", style="dim")
        self._print(line)
        if data.get("deadline"):
            self._print(Text(permission_hint(data, self.run_id), style="dim yellow"))
        self._wait("waiting on a permission")

    def _permission_decision(self, event: Any, view: TurnView) -> None:
        data = event.data
        allowed = data.get("decision") == "allow"
        line = Text(
            f"  {'✓ allowed' if allowed else '✗ denied'} {data.get('request_id')}",
            style="bold green" if allowed else "bold red",
        )
        scope = " for the rest of the run" if data.get("scope") == "always" else ""
        line.append(f"{scope} by {clean(str(data.get('by') or '?'))}", style="dim")
        if data.get("message"):
            line.append(f": {one_line(clean(str(data['message'])))}", style="dim")
        self._print(line)
        self._wait("working")

    def _tool_call(self, event: Any, view: TurnView) -> None:
        data = event.data
        line = Text(
            f"  ⚙ {clean(str(data.get('server')))}.{clean(str(data.get('tool')))}", style="cyan"
        )
        line.append(f"  {one_line(clean(str(data.get('input') or '')))}", style="dim")
        self._print(line)
        self._wait("waiting on a tool")

    def _tool_result(self, event: Any, view: TurnView) -> None:
        data = event.data
        ok = bool(data.get("ok"))
        line = Text(f"  {'✓' if ok else '✗'} {data.get('call_id')} ", style="cyan" if ok else "red")
        line.append(f"{data.get('duration_ms')} ms, {data.get('output_chars')} chars", style="dim")
        line.append(f": {one_line(clean(str(data.get('output') or '')))}", style="dim")
        self._print(line)
        self._wait("working")

    def _usage(self, event: Any, view: TurnView) -> None:
        view.add_usage(event.data)
        self._wait("thinking")

    def _workspace(self, event: Any, view: TurnView) -> None:
        self._print(Text(f"  ✎ {workspace_text(event.data)}", style="magenta"))

    def _parked(self, event: Any, view: TurnView) -> None:
        self._print(Text(f"  ⏸ {parked_text(event.data)}", style="bold yellow"))

    def _user_message(self, event: Any, view: TurnView) -> None:
        data = event.data
        how = {"native": "into the turn", "emulated": "steer, as the next turn"}.get(
            str(data.get("delivery")), str(data.get("mode") or "")
        )
        sender = one_line(str(data.get("by") or "?"), VALUE_LIMIT)
        line = Text(f"  ✉ {sender} ({how}): ", style="bold magenta")
        line.append(one_line(str(data.get("text") or ""), VALUE_LIMIT))
        self._print(line)

    def _outcome_evaluation(self, event: Any, view: TurnView) -> None:
        data = event.data
        met = bool(data.get("satisfied"))
        head = f"  {'✓' if met else '✗'} outcome, iteration {data.get('iteration')}: "
        line = Text(
            head + ("satisfied" if met else "not satisfied"),
            style="bold green" if met else "bold yellow",
        )
        feedback = one_line(str(data.get("feedback") or ""), VALUE_LIMIT)
        if feedback:
            line.append(f" · {feedback}", style="")
        self._print(line)

    def summary(self, record: dict[str, Any], terminal: Any) -> None:
        """After ``--follow``: the run's state and totals, on one line."""
        if self.json:
            return
        self.close()
        status = str(record.get("status") or "?")
        turns = record.get("turns")
        line = Text("run ", style="dim")
        line.append(str(record.get("run_id") or ""), style="bold")
        line.append(" · ", style="dim")
        line.append(status, style=_STATUS_STYLE.get(status, "bold"))
        parts = [
            f"{turns} turn{'' if turns == 1 else 's'}",
            f"tokens {format_tokens(int(record.get('input_tokens') or 0))} in"
            f" / {format_tokens(int(record.get('output_tokens') or 0))} out",
            format_cost(record.get("cost_usd")),
            f"model {record.get('model_reported') or 'not reported'}",
            f"session {record.get('session_id') or '-'}",
        ]
        line.append(" · " + " · ".join(parts), style="dim")
        self._print(line)
        if terminal is None:
            self._print(Text("the stream ended before the turn's terminal event", style="red"))

    # -- helpers ----------------------------------------------------------------------------

    def _view(self, event: Any) -> TurnView:
        if self.turn is None or self.turn.number != event.turn:
            self.turn = TurnView(event.turn)
        return self.turn

    def _wait(self, label: str) -> None:
        if self._spinner is not None and self._at_line_start:
            self._spinner.waiting(label, self.turn)

    def _text(self, view: TurnView, text: str) -> None:
        text = clean(text)
        if not text:
            return
        view.streamed.append(text)
        if view.harness in DELTA_HARNESSES:
            if self._spinner is not None:
                self._spinner.stop()  # a line in progress: the spinner would land inside it
            self.console.print(Text(text), end="")
            self._at_line_start = text.endswith("\n")
        else:
            self._end_text()
            self.console.print(Text(text.rstrip("\n")))
        self.out.flush()

    def _terminal(self, event: Any, view: TurnView) -> None:
        if self._spinner is not None:
            self._spinner.stop()
        data = event.data
        facts = view.close(data, event.ts)
        if event.type == "turn-complete":
            final = clean(str(data.get("text") or ""))
            if final.strip() and final.strip() not in "".join(view.streamed):
                self._print(Text(final.rstrip("\n")))
            head = Text(f"✓ turn {event.turn} complete", style="bold green")
        else:
            reason = data.get("reason") or "?"
            head = Text(f"✗ turn {event.turn} failed ({reason})", style="bold red")
            head.append(f": {clean(str(data.get('error') or ''))}", style="red")
            retry = _retry_hint(data)
            if retry:
                head.append(f" · {retry}", style="yellow")
        self._print(head)
        tail = str(data.get("stderr_tail") or "").strip() if event.type == "session-error" else ""
        if tail:
            for line in tail.splitlines()[-5:]:
                self._print(Text(f"  │ {clean(line)}", style="dim red"))
        self._print(Text("  " + " · ".join(_facts(facts)), style="dim"))


def _facts(facts: dict[str, Any]) -> list[str]:
    out = []
    if facts["duration_s"] is not None:
        out.append(format_duration(facts["duration_s"]))
    out.append(
        f"tokens {format_tokens(facts['input_tokens'])} in / "
        f"{format_tokens(facts['output_tokens'])} out"
    )
    out.append(format_cost(facts["cost_usd"]))
    out.append(f"model {facts['model'] or 'not reported'}")
    out.append(f"session {facts['session_id'] or '-'}")
    return out


def _retry_hint(data: dict[str, Any]) -> str:
    if not data.get("retryable"):
        return "not retryable"
    after = data.get("retry_after_s")
    return f"retryable after {after:g}s" if isinstance(after, int | float) else "retryable"


RECORD_FIRST = (
    "status",
    "waiting",
    "resume_at",
    "waiting_for_slot",
    "silent",
    "last_error",
    "budget_exceeded",
    "warnings",
)
RECORD_ORDER = (
    *RECORD_FIRST,
    *(name for name in RunRecord.model_fields if name not in RECORD_FIRST),
    "credential_live",
)
"""The order ``harness status`` shows a record in: the status first, then what went wrong,
then the rest; fields it does not know follow, as they come."""
VALUE_LIMIT = 120
"""A long text in a record (a system prompt in ``options``) is cut to this many characters."""


def record_rows(record: dict[str, Any], now: float | None = None) -> list[tuple[str, str]]:
    """A run record as (field, text) rows for a person: the status first; times as local
    dates with how long ago (or how soon); options and carry as ``key=value`` lines, warnings
    one per line; None as ``-``. A value may hold several lines."""
    now = time.time() if now is None else now
    fields = dict(record)
    waiting = fields.pop("waiting_for_worker", None)
    if isinstance(waiting, dict):
        fields["waiting"] = waiting_text(waiting, now)
    silent = fields.pop("silent_turn", None)
    if isinstance(silent, dict):
        turn, activity, processes = (silent.get(k) for k in ("turn", "activity", "processes"))
        fields["silent"] = f"turn {turn}: {activity}\n{processes}"
    order = {key: i for i, key in enumerate(RECORD_ORDER)}
    keys = sorted(fields, key=lambda k: order.get(k, len(order)))
    return [(key, clean(_record_value(key, fields[key], now))) for key in keys]


def format_moment(ts: float, now: float | None = None) -> str:
    """A moment for a person: the local date and time, and how long ago or how soon."""
    now = time.time() if now is None else now
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    distance = format_distance(abs(now - ts))
    return f"{clock} ({distance} ago)" if ts <= now else f"{clock} (in {distance})"


def format_distance(seconds: float) -> str:
    """A coarse span: ``12s``, ``3m``, ``2h05m``, ``4d3h``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def _record_value(key: str, value: Any, now: float) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and (key.endswith("_at") or key.endswith("_until")):
        return format_moment(float(value), now)
    if key == "cost_usd" and isinstance(value, int | float):
        return format_cost(float(value))
    if isinstance(value, dict):
        pairs = [
            f"{k}={_pair_value(v)}"
            for k, v in value.items()
            if v is not None and v != [] and v != ()
        ]
        return "\n".join(pairs) or "(none)"
    if isinstance(value, list | tuple):
        return "\n".join(_pair_value(item) for item in value) or "(none)"
    return str(value)


def _pair_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return one_line(text, VALUE_LIMIT) if text.strip() else repr(text)


_STATUS_STYLE = {
    "idle": "bold green",
    "running": "bold cyan",
    "starting": "bold cyan",
    "parked": "bold yellow",
    "ended": "bold",
    "failed": "bold red",
}


class _SpinnerSlot:
    """A transient spinner on the terminal, started only after a short quiet period.

    rich's Live redraws it from its own thread and keeps it below whatever is printed, so
    events print normally while it spins. It is stopped before any text that must not be
    interleaved with it, on a terminal event, and at exit (a Ctrl-C leaves no hidden cursor).
    """

    def __init__(self, console: Console) -> None:
        self._console = console
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._timer: threading.Timer | None = None
        self._label = "thinking"
        self._since = time.monotonic()
        self._turn: TurnView | None = None
        self._spinner = Spinner("dots", style="cyan")  # one object: it keeps the frame clock
        atexit.register(self.stop)

    def waiting(self, label: str, turn: TurnView | None) -> None:
        with self._lock:
            if turn is not self._turn:  # the clock shows how long this turn (or wait) has run
                self._since = time.monotonic()
            self._label, self._turn = label, turn
            if self._live is not None or self._timer is not None:
                return
            self._timer = threading.Timer(SPINNER_DELAY_S, self._start)
            self._timer.daemon = True
            self._timer.start()

    def _start(self) -> None:
        with self._lock:
            if self._timer is None:
                return  # stopped in the meantime
            self._timer = None
            self._live = Live(
                _Status(self),
                console=self._console,
                transient=True,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            live, self._live = self._live, None
        if live is not None:
            live.stop()

    def render(self) -> Spinner:
        turn = self._turn
        label = Text(f"{self._label}…", style="cyan")
        label.append(f" {format_duration(time.monotonic() - self._since)}", style="dim")
        if turn is not None and turn.usage_seen:
            label.append(
                f" · {format_tokens(turn.input_tokens + turn.output_tokens)} tokens", style="dim"
            )
        self._spinner.update(text=label)
        return self._spinner


class _Status:
    """The Live renderable: asks the slot for a fresh line at every refresh."""

    def __init__(self, slot: _SpinnerSlot) -> None:
        self._slot = slot

    def __rich__(self) -> Spinner:
        return self._slot.render()


def permission_hint(data: dict[str, Any], run_id: str | None) -> str:
    """How to answer a waiting permission request, and until when."""
    run, request = run_id or "RUN_ID", data.get("request_id")
    until = time.strftime("%H:%M:%S", time.localtime(float(data["deadline"])))
    return (
        f"    answer: harness approve {run} {request} [--always]  |  "
        f"harness deny {run} {request} [--message TEXT]  (denied at {until} unanswered)"
    )


_EVENT_VIEWS: dict[str, Callable[[Renderer, Any, TurnView], None]] = {
    "turn-started": Renderer._turn_started,
    "session": Renderer._session,
    "assistant-text": Renderer._assistant_text,
    "sandbox-activity": Renderer._activity,
    "permission-request": Renderer._permission_request,
    "permission-decision": Renderer._permission_decision,
    "tool-call": Renderer._tool_call,
    "tool-result": Renderer._tool_result,
    "usage": Renderer._usage,
    "workspace": Renderer._workspace,
    "parked": Renderer._parked,
    "user-message": Renderer._user_message,
    "outcome-evaluation": Renderer._outcome_evaluation,
    **dict.fromkeys(TERMINAL_TYPES, Renderer._terminal),
}
"""How a person sees each event type (JSON output prints them all alike)."""
