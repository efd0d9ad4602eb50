"""The ``harness`` command (CONTRACT.md, "Command line")."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from config import SettingsError
from worker.errors import HarnessError, InvalidInput
from worker.render import Renderer


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"harness: error: {message}\n")


def _text_arg(value: str | None, what: str) -> str:
    if value is None or value == "-":
        data = sys.stdin.buffer.read()
        return data.decode("utf-8", errors="replace")
    return value


def _system_prompt(value: str | None) -> str | None:
    if value and value.startswith("@"):
        try:
            return Path(value[1:]).read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read the system prompt file {value[1:]!r}: {exc}") from exc
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="harness", description="Run coding-agent CLIs as sandboxed Celery work.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def output_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="one JSON object per line")

    run = sub.add_parser("run", help="start a run and its first turn")
    run.add_argument("harness")
    run.add_argument("prompt", nargs="?", default="-", help="the input, or - for stdin")
    run.add_argument("--system-prompt", help="TEXT or @FILE")
    run.add_argument("--model")
    run.add_argument("--posture", choices=("strict", "auto", "dangerous"))
    run.add_argument("--allow", action="append", default=[], metavar="PATTERN")
    run.add_argument("--deny", action="append", default=[], metavar="PATTERN")
    run.add_argument("--grant", action="append", default=[], metavar="NAME")
    run.add_argument("--sandbox", choices=("docker", "local"))
    run.add_argument("--image")
    run.add_argument("--network", choices=("none", "bridge", "host"))
    run.add_argument("--resume-session", metavar="VENDOR_SESSION_ID")
    run.add_argument("--base-url", metavar="URL")
    run.add_argument("--executable", metavar="PATH")
    run.add_argument("--workspace", metavar="NAME", help="a durable workspace shared across runs")
    run.add_argument("--timeout", type=float, metavar="SECONDS")
    run.add_argument("--memory", metavar="SIZE", help="container memory limit, e.g. 512m")
    run.add_argument("--cpus", type=float, metavar="N", help="container CPU limit")
    run.add_argument("--pids", type=int, metavar="N", help="container process limit")
    run.add_argument("--follow", action="store_true")
    output_flags(run)

    turn = sub.add_parser("turn", help="submit the next turn of a run")
    turn.add_argument("run_id")
    turn.add_argument("input", nargs="?", default="-")
    turn.add_argument("--follow", action="store_true")
    output_flags(turn)

    events = sub.add_parser("events", help="print a run's events")
    events.add_argument("run_id")
    events.add_argument("--after", metavar="ID")
    events.add_argument("--follow", action="store_true")
    output_flags(events)

    for name, text in (
        ("status", "print the run record"),
        ("cancel", "stop the in-flight turn"),
        ("end", "tear the run down"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_id")
        output_flags(p)

    reap = sub.add_parser("reap", help="remove sandboxes whose run is gone or whose lease expired")
    output_flags(reap)
    doctor = sub.add_parser("doctor", help="check broker, Redis, Docker, images and harnesses")
    output_flags(doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except SettingsError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (for example `| head`); exit quietly as Unix tools do.
        sys.stderr.close()
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        from worker.doctor import run_doctor

        return run_doctor(json_output=args.json)
    if args.command == "reap":
        from worker.lifecycle import reap_here

        lines = reap_here()
        for line in lines:
            print(json.dumps({"removed": line}) if args.json else line)
        if not lines and not args.json:
            print("nothing to reap")
        return 0

    from worker.client import HarnessClient

    client = HarnessClient()
    renderer = Renderer(json_output=args.json)
    if args.command == "run":
        prompt = _text_arg(args.prompt, "prompt")
        run_id = client.start_run(
            args.harness,
            prompt,
            model=args.model,
            system_prompt=_system_prompt(args.system_prompt),
            posture=args.posture,
            allow=args.allow,
            deny=args.deny,
            grants=args.grant,
            sandbox=args.sandbox,
            image=args.image,
            network=args.network,
            resume_session=args.resume_session,
            base_url=args.base_url,
            executable=args.executable,
            timeout_s=args.timeout,
            workspace=args.workspace,
            memory=args.memory,
            cpus=args.cpus,
            pids=args.pids,
        )
        renderer.accepted(run_id, 1)
        return _follow(client, renderer, run_id, 1) if args.follow else 0
    if args.command == "turn":
        text = _text_arg(args.input, "input")
        number = client.submit_turn(args.run_id, text)
        renderer.accepted(args.run_id, number)
        return _follow(client, renderer, args.run_id, number) if args.follow else 0
    if args.command == "events":
        for event in client.events(args.run_id, after=args.after, follow=args.follow):
            renderer.event(event)
        return 0
    if args.command == "status":
        record = client.status(args.run_id)
        renderer.record(record)
        return 0
    if args.command == "cancel":
        cancelled = client.cancel(args.run_id)
        renderer.message(
            {"run_id": args.run_id, "cancelled": cancelled},
            "cancel requested" if cancelled else "nothing in flight",
        )
        return 0
    if args.command == "end":
        record = client.end(args.run_id)
        note = record.get("last_error") or ""
        text = f"run ended ({note})" if note.startswith("end:") else "run ended"
        renderer.message({"run_id": args.run_id, "status": record["status"], "note": note}, text)
        return 0
    raise AssertionError(args.command)


def _follow(client: Any, renderer: Renderer, run_id: str, turn: int) -> int:
    after = "0-0" if turn <= 1 else f"{turn - 1}-18446744073709551615"
    terminal = None
    for event in client.events(run_id, after=after, follow=True, until_terminal_of=turn):
        renderer.event(event)
        if event.terminal and event.turn == turn:
            terminal = event
    renderer.summary(client.status(run_id), terminal)
    if terminal is not None and terminal.type == "turn-complete":
        return 0
    if terminal is not None and terminal.data.get("reason") == "invalid-input":
        return 2  # refused by the worker's policy: the same answer as a refusal up front
    return 1


if __name__ == "__main__":
    sys.exit(main())
