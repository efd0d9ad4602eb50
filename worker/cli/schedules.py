"""``harness schedule``: runs the workers start on a cron (docs/api.md, "Schedules").

``schedule add NAME --cron EXPR [--tz ZONE] HARNESS INPUT [run options...]`` takes the
options of ``harness run`` after the input, parsed by ``run``'s own parser."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any, NoReturn

from worker.cli.session import Handler, Session
from worker.errors import InvalidInput

EXITS = {
    "schedule": "0 done, 1 an unknown schedule or Redis unreachable, 2 bad usage or refused "
    "(an invalid cron, time zone, name or run option, beyond policy, a name taken)",
}
ACTIONS = ("add", "list", "pause", "resume", "remove", "history")
NOT_FOR_A_SCHEDULE = {
    "attempts": "--attempts",
    "follow": "--follow",
    "wait": "--wait",
    "idempotency_key": "--idempotency-key",
    "archive": "--archive",
    "attach": "--attach",
}
"""``run`` options a schedule does not take: what follows one run, or files on this machine."""


RunParser = Callable[[list[str]], tuple[argparse.Namespace, dict[str, Any]]]
"""``harness run``'s arguments parsed: (its namespace, the client's run options)."""


def add_commands(command: Callable[..., argparse.ArgumentParser], parse_run: RunParser) -> None:
    """``harness schedule``; ``parse_run`` reads the run of ``schedule add`` as ``harness run``
    does (handed in by the command line's main module, which this one does not import)."""
    schedule = command(
        "schedule",
        "start runs on a cron",
        "add NAME --cron EXPR [--tz ZONE] HARNESS INPUT [run options] starts, at each tick of "
        "EXPR (5 fields, or 6 with seconds first; in ZONE, default UTC), a run of HARNESS "
        "with INPUT and the options of `harness run`, labelled schedule=NAME. A worker fires "
        "it (each tick once, whatever the number of workers); a tick missed while no worker "
        "ran fires once when one returns. HARNESS_SCHEDULE_MAX_FAILURES failures in a row "
        "pause it, saying why. list; pause NAME; resume NAME; remove NAME; history NAME.",
    )
    schedule.add_argument("action", choices=ACTIONS, metavar="ACTION", help=", ".join(ACTIONS))
    schedule.add_argument("name", metavar="NAME", nargs="?", help="the schedule's name")
    schedule.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="add: --cron EXPR (5 fields, or 6 with seconds first), --tz ZONE (IANA, default "
        "UTC), then HARNESS INPUT and the options of `harness run`; history: --limit N (the "
        "newest N firings, default 20); every action: --json (one JSON object per line)",
    )
    schedule.set_defaults(parse_run=parse_run)


class _Rest(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InvalidInput(f"schedule: {message}")


def _rest(args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """What follows NAME: this action's options, and for ``add`` the run's arguments."""
    parser = _Rest(prog="harness schedule", add_help=False)
    parser.add_argument("--json", action="store_true")
    if args.action == "add":
        parser.add_argument("--cron", required=True)
        parser.add_argument("--tz")
    if args.action == "history":
        parser.add_argument("--limit", type=int, default=20)
    parsed, run = parser.parse_known_args(args.rest)
    if run and args.action != "add":
        raise InvalidInput(f"schedule {args.action}: unexpected {' '.join(run)[:80]!r}")
    args.json = args.json or parsed.json  # before the renderer is made
    return parsed, run


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _line(shown: dict[str, Any]) -> str:
    state = f"paused ({shown['paused_reason']})" if shown["paused"] else "active"
    return (
        f"{shown['name']}  {shown['cron']} {shown['tz']}  {shown['harness']}  {state}  "
        f"next {_when(shown['next_at'])}  last run {shown['last_run_id'] or '-'}"
    )


def _add(args: argparse.Namespace, session: Session) -> dict[str, Any]:
    parsed, rest = _rest(args)
    if len(rest) < 2:
        raise InvalidInput("schedule add needs HARNESS INPUT after --cron EXPR")
    run, run_options = args.parse_run(rest)
    for dest, flag in NOT_FOR_A_SCHEDULE.items():
        if getattr(run, dest, None):
            raise InvalidInput(f"a schedule does not take {flag}")
    options = {k: v for k, v in run_options.items() if v not in (None, [], {})}
    added: dict[str, Any] = session.client.add_schedule(
        args.name, parsed.cron, run.harness, run.prompt, tz=parsed.tz, **options
    )
    return added


def _schedule(args: argparse.Namespace, session: Session) -> int:
    args.json = False
    if args.action != "list" and not args.name:
        raise InvalidInput(f"schedule {args.action} needs NAME")
    if args.action == "list" and args.name:  # list --json: the flag came as NAME
        args.rest, args.name = [args.name, *args.rest], None
    if args.action == "add":
        shown = _add(args, session)
        session.renderer.message(shown, _line(shown))
        return 0
    parsed, _ = _rest(args)
    client, renderer = session.client, session.renderer
    if args.action == "list":
        for shown in client.list_schedules():
            renderer.message(shown, _line(shown))
        return 0
    if args.action == "history":
        for entry in client.schedule_history(args.name, limit=max(parsed.limit, 1)):
            outcome = entry.get("run_id") or f"error: {entry.get('error')}"
            late = " (missed: fired late, once)" if entry.get("missed") else ""
            renderer.message(entry, f"{_when(entry['tick'])}  {outcome}{late}")
        return 0
    if args.action == "remove":
        client.remove_schedule(args.name)
        renderer.message({"name": args.name, "removed": True}, f"schedule {args.name} removed")
        return 0
    shown = (
        client.pause_schedule(args.name)
        if args.action == "pause"
        else (client.resume_schedule(args.name))
    )
    renderer.message(shown, _line(shown))
    return 0


HANDLERS: dict[str, Handler] = {"schedule": _schedule}
