"""The ``harness`` commands that control running work: ``steer`` (a message to a run), and
``fork``, ``attempts`` and ``pick`` (worker/control/)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from worker.cli.session import Handler, Session

EXITS = {
    "attempts": "0 done, 1 unknown group or Redis unreachable, 2 bad usage (an attempt the "
    "group does not have)",
    "pick": "0 picked, 1 unknown group or Redis unreachable, 2 refused: another attempt was "
    "picked already, an attempt the group does not have",
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

    attempts = command(
        "attempts",
        "compare the attempts of a group side by side",
        "Compare the attempts of a group (harness run --attempts N): each one's outcome, "
        "answer, structured result, diff stats, tokens, cost and wall time. With --diff A B, "
        "print instead the unified diff from attempt A's workspace to attempt B's.",
    )
    attempts.add_argument("group", metavar="GROUP", help="as harness run --attempts printed it")
    attempts.add_argument("--diff", nargs=2, type=int, metavar=("A", "B"), help="two attempts")
    attempts.add_argument("--json", action="store_true", help="one JSON object: the table")
    pick = command(
        "pick",
        "keep one attempt of a group, end the others",
        "Pick attempt N of a group: the other attempts are ended, N goes on as a normal run "
        "(its next turn: harness turn; its branch: --push-branch pushed it). The first pick "
        "wins.",
    )
    pick.add_argument("group", metavar="GROUP", help="as harness run --attempts printed it")
    pick.add_argument("attempt", metavar="N", type=int, help="the attempt to keep, from 1")
    pick.add_argument("--export", metavar="FILE", help="also write its workspace to FILE (tar.gz)")
    pick.add_argument("--json", action="store_true", help="one JSON object: the pick")


def _attempts(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    if args.diff:
        sys.stdout.write(client.attempts_diff(args.group, *args.diff))
        return 0
    table = client.attempts(args.group)
    lines = [
        f"group {table['group']}" + (f" · picked {table['picked']}" if table["picked"] else "")
    ]
    for row in table["attempts"]:
        diff = row.get("diff") or {}
        cost = row.get("cost_usd")
        spent = f"${cost:.4f}" if cost is not None else "cost ?"
        lines.append(
            f"{row['index']}. {row['run_id']}  {row.get('harness')}"
            f"{'/' + row['model'] if row.get('model') else ''}  {row.get('status')}  "
            f"{row.get('outcome')}  files {diff.get('files', 0)} "
            f"+{diff.get('lines_added', 0)} -{diff.get('lines_removed', 0)}  "
            f"tokens {row.get('input_tokens', 0)} in / {row.get('output_tokens', 0)} out  "
            f"{spent}  {row.get('wall_s', 0)}s"
        )
        answer = row.get("structured") or row.get("answer")
        if answer:
            text = answer if isinstance(answer, str) else json.dumps(answer)
            lines.append("   " + " ".join(text.split())[:160])
    renderer.message(table, "\n".join(lines))
    return 0


def _pick(args: argparse.Namespace, session: Session) -> int:
    picked = session.client.pick(args.group, args.attempt, export_to=args.export)
    text = f"picked attempt {picked['picked']}: run {picked['run_id']} goes on"
    if picked["ended"]:
        text += f"; ended {', '.join(picked['ended'])}"
    if picked.get("export"):
        text += f"; its workspace written to {args.export}"
    session.renderer.message(picked, text)
    return 0


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


HANDLERS: dict[str, Handler] = {"steer": _steer, "attempts": _attempts, "pick": _pick}
