"""The ``harness`` command's part of spending: budget and limit options of ``run``, and
``harness budget RUN_ID [--max-...]`` (worker/spend/budgets.py, worker/spend/parking.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from worker.cli.session import Handler, Session

EXITS = {
    "budget": "0 done, 1 unknown run or Redis unreachable, 2 bad usage or above the "
    "operator's ceiling",
}

_LIMITS: tuple[tuple[str, type, str, str], ...] = (
    ("--max-cost-usd", float, "USD", "the run's budget in USD (harnesses that price a turn)"),
    ("--max-tokens", int, "N", "the run's budget in tokens: input (replayed too) plus output"),
    ("--max-turns", int, "N", "the most turns the run may begin (a retry after a park too)"),
    ("--max-wall-s", float, "SECONDS", "the most seconds the run's turns may run in all"),
)


def _add_limits(p: argparse.ArgumentParser, bound: str, joint: str) -> None:
    for flag, kind, metavar, text in _LIMITS:
        p.add_argument(flag, type=kind, metavar=metavar, help=f"{text}{joint}{bound}")


def add_run_options(run: argparse.ArgumentParser, bound: str) -> None:
    """``run``'s budget options (a turn crossing a limit is stopped: reason budget) and
    ``--on-limit``."""
    _add_limits(run, bound, ", ")
    run.add_argument(
        "--on-limit",
        choices=("park", "fail"),
        help="a turn that meets a rate limit, or a quota with a reset time: park the run and "
        "send the turn again at the reset (park), or end it (fail); default HARNESS_ON_LIMIT",
    )
    run.add_argument(
        "--producer",
        metavar="ID",
        help="who submits the run: turns waiting for a concurrency slot of an API key are "
        "served fairly across producers",
    )


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_cost_usd": args.max_cost_usd,
        "max_tokens": args.max_tokens,
        "max_turns": args.max_turns,
        "max_wall_s": args.max_wall_s,
        "on_limit": args.on_limit,
        "producer": args.producer,
    }


def add_commands(
    command: Callable[..., argparse.ArgumentParser],
    run_id: Callable[[argparse.ArgumentParser], None],
    bound: str,
) -> None:
    budget = command(
        "budget",
        "show or change a run's budget",
        "Show a run's budget and what it has spent; with --max-..., change those limits "
        "(0 removes one, up to the operator's ceiling). Raising a spent budget lets the run "
        "take turns again: the next turn resumes the same vendor session, with the workspace "
        "as the stopped turn left it.",
    )
    run_id(budget)
    _add_limits(budget, bound, "; 0 removes it, ")
    budget.add_argument(
        "--json", action="store_true", help="one JSON object: run_id, budget, spent, exceeded"
    )


def _budget(args: argparse.Namespace, session: Session) -> int:
    limits = {
        "max_cost_usd": args.max_cost_usd,
        "max_tokens": args.max_tokens,
        "max_turns": args.max_turns,
        "max_wall_s": args.max_wall_s,
    }
    shown = session.client.set_budget(args.run_id, **limits)
    session.renderer.message(shown, budget_text(shown))
    return 0


HANDLERS: dict[str, Handler] = {"budget": _budget}


def budget_text(shown: dict[str, Any]) -> str:
    """``harness budget`` for a person: each limit with what is spent of it."""
    spent = shown["spent"]
    used = {
        "max_cost_usd": spent.get("cost_usd"),
        "max_tokens": spent.get("tokens"),
        "max_turns": spent.get("turns"),
        "max_wall_s": spent.get("wall_s"),
    }
    lines = []
    for name, limit in shown["budget"].items():
        value = used.get(name)
        text = "none" if limit is None else f"{limit:g}"
        lines.append(f"{name:<13} {text:<12} used {0 if value is None else value:g}")
    exceeded = shown.get("exceeded")
    if exceeded:
        lines.append(
            f"spent: {exceeded['budget']} {exceeded['limit']:g}, used {exceeded['used']:g} "
            f"(over by {exceeded['over_by']:g}); raise it to take turns again"
        )
    return "\n".join(lines)
