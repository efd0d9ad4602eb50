"""Run budgets: what a run may spend, enforced before and during every turn.

A run's budget has four limits, each optional: ``max_cost_usd``, ``max_tokens`` (input,
replayed context included, plus output), ``max_turns`` (turns begun, a turn the worker sends
again after a park included) and ``max_wall_s`` (seconds its turns have run, in all). The
producer names them at the start (``harness run --max-...``), the operator's settings give
defaults and ceilings (``HARNESS_RUN_*``, ``HARNESS_MAX_RUN_*``), and ``harness budget``
raises them later. The record's ``budget`` holds them; the worker clamps what it reads to the
ceilings again (it never trusts what a producer wrote).

* Before a turn: :func:`refusal` refuses a turn whose run has spent a limit (the client
  refuses it even earlier, with :class:`~worker.errors.BudgetSpent`).
* During a turn: a :class:`Guard` sees every ``usage`` event as it is published and the
  clock at every poll of the read loop; a limit crossed stops the harness as a cancel does,
  and the turn ends with a ``session-error`` of reason ``budget`` (not retryable). The
  workspace and the vendor session are kept: after the budget is raised, the next turn
  resumes the session. Cost is known only when a harness prices a usage event: harnesses that
  price a turn only at its end (see docs/adapters.md) are held mid-turn by ``max_tokens``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.events import (
    AssistantText,
    Event,
    PermissionRequest,
    SandboxActivity,
    SessionError,
    Usage,
    session_error,
)
from config import Settings
from worker.errors import InvalidInput
from worker.options.spec import BUDGET_MAXIMA, RunOptions
from worker.store.records import RunRecord


class Halting(Protocol):
    """What a turn's read loop keeps of a limit crossed by an event already published."""

    halt: SessionError | None


@dataclass
class UsageTotals:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_input_tokens += usage.cached_input_tokens
        if usage.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + usage.cost_usd

    def as_tuple(self) -> tuple[int, int, int, float | None]:
        return (self.input_tokens, self.output_tokens, self.cached_input_tokens, self.cost_usd)


LIMITS: tuple[str, ...] = ("max_cost_usd", "max_tokens", "max_turns", "max_wall_s")
"""The budget's limits, as the run options, the record's ``budget`` and the CLI name them."""

_CEILING = {
    "max_cost_usd": "max_run_cost_usd",
    "max_tokens": "max_run_tokens",
    "max_turns": "max_run_turns",
    "max_wall_s": "max_run_wall_s",
}
_DEFAULT = {
    "max_cost_usd": "run_cost_usd",
    "max_tokens": "run_tokens",
    "max_turns": "run_turns",
    "max_wall_s": "run_wall_s",
}
_INTEGRAL = frozenset({"max_tokens", "max_turns"})

COST_AT_END: dict[str, bool] = {
    "claude-code": True,
    "codex": False,
    "gemini": False,
    "opencode": False,
    "pi": False,
    "stdio-json": False,
}
"""Per harness that prices turns (``cost_reporting``): True when its cost arrives only with
the turn's final message (claude-code's ``result``), so that ``max_cost_usd`` can only refuse
the next turn and ``max_tokens`` is what stops such a turn midway. Harnesses without
``cost_reporting`` are False here and priced never. docs/adapters.md shows this table."""


def _ceiling(settings: Settings, name: str) -> float | None:
    value = getattr(settings, _CEILING[name])
    return float(value) if value else None


def _number(name: str, value: float) -> float | int:
    return int(value) if name in _INTEGRAL else float(value)


def initial(options: RunOptions, settings: Settings) -> dict[str, Any]:
    """A new run's budget: the producer's limits, else the operator's defaults, else the
    ceilings. InvalidInput when a limit asked for is above its ceiling."""
    return check(
        {name: getattr(options, name) for name in LIMITS},
        settings,
        fill=True,
    )


def check(asked: Mapping[str, Any], settings: Settings, *, fill: bool = False) -> dict[str, Any]:
    """Limits as a producer asked for them, refused above the operator's ceilings. With
    ``fill``, a limit not asked for takes the operator's default (or ceiling)."""
    budget: dict[str, Any] = {}
    for name in LIMITS:
        value = asked.get(name)
        ceiling = _ceiling(settings, name)
        if value is None and fill:
            default = getattr(settings, _DEFAULT[name]) or ceiling
            value = min(default, ceiling) if default and ceiling else default
        if value is None or value == 0:
            if name in asked or fill:
                budget[name] = None if ceiling is None else _number(name, ceiling)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise InvalidInput(f"{name}: must be a number above 0, not {value!r}")
        if not value <= BUDGET_MAXIMA[name]:  # inf too (nan is not above 0)
            raise InvalidInput(f"{name}: must be at most {BUDGET_MAXIMA[name]:g}")
        if ceiling is not None and value > ceiling:
            raise InvalidInput(
                f"{name} {value:g} is above the operator's ceiling {ceiling:g} "
                f"(HARNESS_{_CEILING[name].upper()})"
            )
        budget[name] = _number(name, value)
    return budget


def effective(record: RunRecord, settings: Settings) -> dict[str, Any]:
    """The limits in force for a run: its record's budget (or, for a record without one, its
    options and the operator's defaults), each clamped to the ceiling."""
    budget = dict(record.budget)
    if not budget and record.options is not None:
        try:
            budget = initial(record.options, settings)
        except InvalidInput:
            budget = {}
    out: dict[str, Any] = {}
    for name in LIMITS:
        value, ceiling = budget.get(name), _ceiling(settings, name)
        if ceiling is not None and (value is None or value > ceiling):
            value = _number(name, ceiling)
        out[name] = value
    return out


@dataclass(frozen=True)
class Spent:
    """A run's spend: totals over its turns (the current one included when in a guard)."""

    tokens: int
    cost_usd: float | None
    turns: int
    wall_s: float

    def of(self, name: str) -> float | None:
        return {
            "max_cost_usd": self.cost_usd,
            "max_tokens": float(self.tokens),
            "max_turns": float(self.turns),
            "max_wall_s": self.wall_s,
        }[name]


def spent(record: RunRecord) -> Spent:
    return Spent(
        record.input_tokens + record.output_tokens,
        record.cost_usd,
        record.turns,
        record.wall_s,
    )


@dataclass(frozen=True)
class Over:
    """A limit reached: which, and by how much (what the record's ``budget_exceeded`` says)."""

    budget: str
    limit: float
    used: float
    estimated: bool = False
    """``used`` counts output the harness streamed but had not reported usage for yet."""

    @property
    def exceeded(self) -> dict[str, Any]:
        over_by = self.used - self.limit
        out: dict[str, Any] = {
            "budget": self.budget,
            "limit": self.limit,
            "used": round(self.used, 6),
            "over_by": round(over_by, 6) if not math.isclose(over_by, 0) else 0,
        }
        if self.estimated:
            out["estimated"] = True
        return out

    def error(self, when: str) -> SessionError:
        flag = "--" + self.budget.replace("_", "-")
        about = " (estimated from its output so far)" if self.estimated else ""
        return session_error(
            f"the run's budget is spent {when}: {self.budget} {self.limit:g}, used "
            f"{self.used:g}{about}; raise it with `harness budget RUN_ID {flag} N` and send the "
            "next turn (the session and the workspace are kept)",
            "budget",
        )


def first_over(budget: Mapping[str, Any], used: Spent, *, turn_starting: bool) -> Over | None:
    """The first limit ``used`` has reached. A turn about to start needs room for itself: it
    is refused when its number is above ``max_turns`` or a spend limit is already reached;
    during a turn, a spend limit is crossed when exceeded."""
    for name in LIMITS:
        limit = budget.get(name)
        value = used.of(name)
        if limit is None or value is None:
            continue
        if name == "max_turns":
            if turn_starting and value > limit:
                return Over(name, float(limit), value)
            continue
        if value > limit or (turn_starting and value >= limit):
            return Over(name, float(limit), value)
    return None


def refusal(record: RunRecord, settings: Settings) -> Over | None:
    """Why a turn of this run may not start (its run's ``turns`` already counts it)."""
    return first_over(effective(record, settings), spent(record), turn_starting=True)


def submit_refusal(record: RunRecord, settings: Settings) -> Over | None:
    """Why the run's next turn would be refused (the client asks before it begins one)."""
    used = spent(record)
    ahead = Spent(used.tokens, used.cost_usd, used.turns + 1, used.wall_s)
    return first_over(effective(record, settings), ahead, turn_starting=True)


class Guard:
    """The budget of one turn in flight: told every usage total as it is published
    (:meth:`on_usage`) and asked by the read loop's stop check (:meth:`stop_check`)."""

    def __init__(self, record: RunRecord, settings: Settings) -> None:
        self.budget = effective(record, settings)
        self.before = spent(record)
        self.started = time.monotonic()
        self.over: Over | None = None
        limits = self.budget
        self._tokens = limits.get("max_tokens")
        self._cost = limits.get("max_cost_usd")
        self._wall = limits.get("max_wall_s")
        self.active = any(limits.get(name) is not None for name in LIMITS)
        self._estimate = 0
        """Tokens estimated from output streamed since the last usage event."""

    def on_event(self, event: Event, turn: UsageTotals) -> SessionError | None:
        """Every event of the turn as it is published, with the turn's usage so far: the
        budget error once a limit is crossed, else None.

        Output streamed since the harness last reported usage counts as an estimate of its
        tokens (a quarter of its characters): claude-code, codex and gemini report usage only
        with their final message, and a budget must stop them midway all the same.
        """
        if self.over is not None:
            return None
        if isinstance(event, Usage):
            if event.source == "gateway":
                return None  # the wire's count: the gateway holds its own (at_gateway)
            self._estimate = 0
        elif isinstance(event, AssistantText):
            self._estimate += math.ceil(len(event.text) / 4)
        elif isinstance(event, SandboxActivity | PermissionRequest):
            self._estimate += math.ceil(len(event.description) / 4)
        else:
            return None
        return self.on_usage(turn)

    def clear(self, events: Sequence[Event], turn: UsageTotals) -> bool:
        """Whether no limit can be crossed by ``events``, published after ``turn`` (the
        turn's usage before them): then the estimate has moved as :meth:`on_event` would
        have moved it, and nothing per event is needed. False (nothing changed) when one of
        them crosses a limit: :meth:`on_event` of each then says which and where.

        The same sums as :meth:`on_event` and :meth:`on_usage`, for a batch in one loop:
        calling them per event was ~8% of a flood's cost (docs/performance.md, row 8). The
        limits are compared only where the sums can peak: between two usage events the
        estimate only grows and the tokens reported stay, so the largest estimate of such a
        stretch is its last, seen at the usage event that ends it or at the batch's end; the
        cost moves only at a usage event. With neither ``max_tokens`` nor ``max_cost_usd``,
        no event can cross anything."""
        tokens_limit, cost_limit = self._tokens, self._cost
        if self.over is not None or (tokens_limit is None and cost_limit is None):
            return True
        room = math.inf if tokens_limit is None else tokens_limit - self.before.tokens
        cost_before = self.before.cost_usd or 0.0
        tokens = turn.input_tokens + turn.output_tokens
        cost = turn.cost_usd
        estimate = self._estimate
        for event in events:
            kind = event.type
            if kind == "assistant-text":
                estimate += (len(event.text) + 3) // 4  # type: ignore[union-attr]
            elif kind == "usage" and event.source != "gateway":  # type: ignore[union-attr]
                if tokens + estimate > room:
                    return False  # crossed by the last estimate before this report
                estimate = 0
                tokens += event.input_tokens + event.output_tokens  # type: ignore[union-attr]
                if tokens > room:
                    return False
                if event.cost_usd is not None:  # type: ignore[union-attr]
                    cost = (cost or 0.0) + event.cost_usd  # type: ignore[union-attr]
                    if cost_limit is not None and cost_before + cost > cost_limit:
                        return False
            elif kind == "sandbox-activity" or kind == "permission-request":
                estimate += (len(event.description) + 3) // 4  # type: ignore[union-attr]
        if tokens + estimate > room:
            return False
        self._estimate = estimate
        return True

    def on_usage(self, turn: UsageTotals) -> SessionError | None:
        """The turn's usage so far against the token and cost limits."""
        if self.over is not None:
            return None
        before = self.before
        if self._tokens is not None:
            used = before.tokens + turn.input_tokens + turn.output_tokens + self._estimate
            if used > self._tokens:
                over = Over("max_tokens", float(self._tokens), float(used), self._estimate > 0)
                return self._crossed(over)
        if self._cost is not None and turn.cost_usd is not None:
            cost = (before.cost_usd or 0.0) + turn.cost_usd
            if cost > self._cost:
                return self._crossed(Over("max_cost_usd", float(self._cost), cost))
        return None

    def at_gateway(self, wire_tokens: int, turn: UsageTotals) -> SessionError | None:
        """Whether the model gateway may send one more request of this turn: refused (the
        budget error, and the turn stopped with it) once a token or cost limit is reached.
        The turn's tokens are the larger of the wire's count (``wire_tokens``) and the
        harness's; the cost is the harness's (the wire carries no prices)."""
        if self.over is not None:
            return self.over.error("at the model gateway")
        before = self.before
        if self._tokens is not None:
            used = before.tokens + max(wire_tokens, turn.input_tokens + turn.output_tokens)
            if used >= self._tokens:
                self.over = Over("max_tokens", float(self._tokens), float(used))
                return self.over.error("at the model gateway")
        if self._cost is not None and (before.cost_usd is not None or turn.cost_usd is not None):
            cost = (before.cost_usd or 0.0) + (turn.cost_usd or 0.0)
            if cost >= self._cost:
                self.over = Over("max_cost_usd", float(self._cost), cost)
                return self.over.error("at the model gateway")
        return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def on_clock(self) -> SessionError | None:
        if self._wall is None or self.over is not None:
            return None
        used = self.before.wall_s + self.elapsed()
        if used > self._wall:
            return self._crossed(Over("max_wall_s", float(self._wall), used))
        return None

    def _crossed(self, over: Over) -> SessionError:
        self.over = over
        return over.error("during the turn")

    def stop_check(
        self, inner: Callable[[], SessionError | None], out: Halting
    ) -> Callable[[], SessionError | None]:
        """What the read loop asks every poll: a limit crossed by a usage event already
        published (``out.halt``), then ``inner`` (a hold lost, shutdown), then the wall clock."""

        def check() -> SessionError | None:
            return out.halt or inner() or self.on_clock()

        return check

    def next_turn_refusal(self, turn: UsageTotals) -> Over | None:
        """Why a turn after this one would be refused, this turn's usage counted."""
        before = self.before
        cost = before.cost_usd
        if turn.cost_usd is not None:
            cost = (cost or 0.0) + turn.cost_usd
        after = Spent(
            before.tokens + turn.input_tokens + turn.output_tokens,
            cost,
            before.turns + 1,
            before.wall_s + self.elapsed(),
        )
        return first_over(self.budget, after, turn_starting=True)

    def changes(self) -> dict[str, Any]:
        """What the record keeps of this turn's spend: the run's wall time, and which limit
        was crossed (a harness that finished its turn before we saw it is not stopped, but
        the next turn is refused)."""
        out: dict[str, Any] = {"wall_s": round(self.before.wall_s + self.elapsed(), 3)}
        if self.over is not None:
            out["budget_exceeded"] = self.over.exceeded
        return out
