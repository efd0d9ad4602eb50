"""The ``harness`` commands that bring work in and out of a run: the seed options of ``run``,
and ``diff``, ``export`` and ``rewind`` (answered by the run's host, from any machine)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from worker.cli.session import Handler, Session
from worker.errors import InvalidInput

EXITS = {
    "diff": "0 done, 1 unknown run, no such snapshot, or the run's host cannot be reached, "
    "2 bad usage",
    "export": "0 written, 1 unknown run, no such snapshot, over the operator's ceiling, or the "
    "run's host cannot be reached, 2 bad usage",
    "rewind": "0 rewound, 1 unknown run, no such snapshot or the run's host cannot be reached, "
    "2 bad usage, a turn in flight or an ended run",
}

Command = Callable[[str, str, str], argparse.ArgumentParser]


def add_seed_options(run: argparse.ArgumentParser, bound: str) -> None:
    run.add_argument(
        "--repo",
        metavar="URL",
        help="a git repository the worker clones into the workspace before the first turn, "
        f"{bound} (schemes and hosts); its credential is the worker's, never the sandbox's",
    )
    run.add_argument(
        "--ref", metavar="REF", help="with --repo: the branch, tag or commit (default: HEAD)"
    )
    run.add_argument(
        "--archive",
        metavar="FILE",
        help="a tar, tar.gz or zip to unpack into the workspace (uploaded through Redis; "
        f"size and file count {bound})",
    )
    run.add_argument(
        "--push-branch",
        metavar="NAME",
        help="with --repo: push each turn's snapshot as a commit to this branch of the "
        "repository (by the worker, with its credential)",
    )


def seed_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "repo": args.repo,
        "ref": args.ref,
        "archive": args.archive,
        "push_branch": args.push_branch,
    }


def add_commands(command: Command, run_id: Callable[[argparse.ArgumentParser], None]) -> None:
    diff = command(
        "diff",
        "print a unified diff of a run's workspace",
        "Print a unified diff of the run's workspace between two of its snapshots (one is "
        "taken after every turn; 0 is the workspace before the first turn): by default from "
        "the first to the last; binary files are named, not printed.",
    )
    run_id(diff)
    diff.add_argument("--turn", type=int, metavar="N", help="what turn N changed")
    diff.add_argument("--from", dest="from_turn", type=int, metavar="N", help="from after turn N")
    diff.add_argument("--to", dest="to_turn", type=int, metavar="M", help="to after turn M")

    export = command(
        "export",
        "write a run's workspace as a tar.gz",
        "Write a tar.gz of the run's workspace as it was after a turn (default: the last), "
        "from its snapshot on the run's host. Refused above the operator's "
        "HARNESS_EXPORT_MAX_BYTES.",
    )
    run_id(export)
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the tar.gz")
    export.add_argument("--turn", type=int, metavar="N", help="after turn N (default: last)")
    export.add_argument("--json", action="store_true", help="one JSON object: what was written")

    rewind = command(
        "rewind",
        "put a run's workspace back as it was after a turn",
        "Put the idle run's workspace back as it was after turn N (0: before the first turn). "
        "The next turn sees it, and publishes the rewind as a workspace event after its "
        "turn-started. The harness's own session (its memory of the conversation) is kept.",
    )
    run_id(rewind)
    rewind.add_argument("turn", type=int, metavar="N", help="the turn to go back to")
    rewind.add_argument("--json", action="store_true", help="one JSON object: what changed")


def _diff(args: argparse.Namespace, session: Session) -> int:
    if args.turn is not None and (args.from_turn is not None or args.to_turn is not None):
        raise InvalidInput("give --turn, or --from and --to, not both")
    session.client.diff(
        args.run_id,
        turn=args.turn,
        from_turn=args.from_turn,
        to_turn=args.to_turn,
        out=sys.stdout.buffer,
    )
    sys.stdout.flush()
    return 0


def _export(args: argparse.Namespace, session: Session) -> int:
    facts = session.client.export(args.run_id, args.output, turn=args.turn)
    session.renderer.message(
        {"run_id": args.run_id, "output": args.output, **facts},
        f"wrote {args.output}: the workspace after turn {facts.get('turn')} "
        f"({facts.get('bytes')} bytes)",
    )
    return 0


def _rewind(args: argparse.Namespace, session: Session) -> int:
    change = session.client.rewind(args.run_id, args.turn)
    counts = (
        f"{change.get('added_count', 0)} added, {change.get('modified_count', 0)} "
        f"modified, {change.get('deleted_count', 0)} deleted"
    )
    session.renderer.message(
        {"run_id": args.run_id, **change},
        f"rewound to turn {args.turn} ({counts}); the next turn sees it",
    )
    return 0


HANDLERS: dict[str, Handler] = {"diff": _diff, "export": _export, "rewind": _rewind}
