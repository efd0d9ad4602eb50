"""The ``harness`` commands that control running work: ``steer`` (a message to a run), and
``fork``, ``attempts`` and ``pick`` (worker/control/)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from worker.cli.session import Handler, Session

EXITS = {
    "steer": "0 sent, 1 unknown run or Redis unreachable, 2 refused: the run ended, its "
    "budget refuses the turn the message would start, an empty or oversized text",
}
Command = Callable[[str, str, str], argparse.ArgumentParser]


def add_commands(command: Command, run_id: Callable[[argparse.ArgumentParser], None]) -> None:
    steer = command(
        "steer",
        "send a message to a run",
        "Send a message to a run. --mode queue (default): it becomes the next turn once the "
        "turn in flight ends. steer: into the running turn, on the harness's own channel "
        "where its capability `steering` has one (else the turn is stopped and the message "
        "starts the next one). interrupt: the running turn stops as on cancel and the "
        "message starts the next turn in the same session. To a run with nothing in flight, "
        "every mode starts the next turn now. The stream shows it as a user-message event.",
    )
    run_id(steer)
    steer.add_argument("text", metavar="TEXT", help="the message; - reads standard input")
    steer.add_argument(
        "--mode", choices=("queue", "steer", "interrupt"), default="queue", help="how it is sent"
    )
    steer.add_argument(
        "--by", metavar="WHO", help="who sends it, as the stream records it (default user@host)"
    )
    steer.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: {run_id, message_id, mode, turn, state}",
    )


def _steer(args: argparse.Namespace, session: Session) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    sent = session.client.steer(args.run_id, text, mode=args.mode, by=args.by)
    what = {
        "sent-to-turn": f"sent to turn {sent['turn']}, running",
        "queued": f"queued: it starts the turn after turn {sent['turn']}",
        "started": f"started turn {sent['turn']} with it",
    }[sent["state"]]
    session.renderer.message(sent, f"{sent['message_id']}: {what}")
    return 0


HANDLERS: dict[str, Handler] = {"steer": _steer}
