"""The ``harness`` commands that answer permission requests of a ``--posture ask`` run:
``pending``, ``approve`` and ``deny`` (worker/permissions/requests.py; from any machine that reaches
Redis)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from worker.cli.session import Handler, Session

EXITS = {
    "pending": "0 done (also when nothing waits), 1 unknown run or Redis unreachable",
    "approve": "0 allowed, 1 unknown run or request, 2 refused: answered already (the "
    "first answer wins), expired or closed",
    "deny": "0 denied, 1 unknown run or request, 2 refused: answered already (the first "
    "answer wins), expired or closed",
}
Command = Callable[[str, str, str], argparse.ArgumentParser]


def add_commands(command: Command, run_id: Callable[[argparse.ArgumentParser], None]) -> None:
    pending = command(
        "pending",
        "list a run's permission requests waiting for an answer",
        "List the permission requests of a --posture ask run that wait for an answer: id, "
        "tool, what it would run, and when it is denied unanswered.",
    )
    run_id(pending)
    pending.add_argument("--json", action="store_true", help="one JSON object per request")

    for name, verb in (("approve", "allow"), ("deny", "deny")):
        p = command(
            name,
            f"{verb} a waiting permission request",
            f"{verb.capitalize()} a waiting permission request of a --posture ask run. The "
            "first answer wins; a second, a late or an unknown one is refused.",
        )
        run_id(p)
        p.add_argument("request_id", metavar="REQUEST_ID", help="as `harness pending` shows it")
        if name == "approve":
            p.add_argument(
                "--always",
                action="store_true",
                help="also allow the same tool call again for the rest of the run, unasked",
            )
        else:
            p.add_argument(
                "--message", metavar="TEXT", help="what the model is told about the denial"
            )
        p.add_argument(
            "--by", metavar="WHO", help="who answers, as the stream records it (default user@host)"
        )
        p.add_argument("--json", action="store_true", help="one JSON object: the answer")


def _pending(args: argparse.Namespace, session: Session) -> int:
    renderer = session.renderer
    requests = session.client.pending(args.run_id)
    if not requests and not renderer.json:
        renderer.message({}, "nothing waits for an answer")
    for request in requests:
        renderer.message(request, _line(args.run_id, request))
    return 0


def _approve(args: argparse.Namespace, session: Session) -> int:
    answer = session.client.approve(args.run_id, args.request_id, always=args.always, by=args.by)
    return _answered(args, session, answer)


def _deny(args: argparse.Namespace, session: Session) -> int:
    answer = session.client.deny(args.run_id, args.request_id, message=args.message, by=args.by)
    return _answered(args, session, answer)


def _answered(args: argparse.Namespace, session: Session, answer: dict[str, Any]) -> int:
    scope = " for the rest of the run" if answer.get("scope") == "always" else ""
    session.renderer.message(
        {"run_id": args.run_id, "request_id": args.request_id, **answer},
        f"{'allowed' if answer['decision'] == 'allow' else 'denied'} {args.request_id}{scope}",
    )
    return 0


HANDLERS: dict[str, Handler] = {"pending": _pending, "approve": _approve, "deny": _deny}


def _line(run_id: str, request: dict[str, Any]) -> str:
    until = time.strftime("%H:%M:%S", time.localtime(float(request.get("deadline") or 0)))
    what = request.get("command") or request.get("input") or request.get("description")
    return (
        f"{request.get('request_id')}  turn {request.get('turn')}  {request.get('tool')}: "
        f"{what}  (denied at {until} unanswered; harness approve {run_id} "
        f"{request.get('request_id')})"
    )
