"""The ``harness`` command (CONTRACT.md, "Command line")."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from config import SettingsError
from worker.errors import HarnessError, InvalidInput, TurnWaitTimeout, Unavailable
from worker.policy import not_utf8
from worker.render import Renderer

EXIT_STATUSES = f"""\
exit status:
  0    done (with --follow: the turn completed; without: the turn was accepted)
  1    the turn failed, the run is unknown, or Redis or the broker cannot be reached
       (reap: a sandbox backend could not be asked)
  2    bad usage, or refused: invalid input (text that is not UTF-8 included), unknown
       harness, beyond operator policy, a turn already in flight, the run has ended
  {TurnWaitTimeout.exit_code}  --wait: no worker started the turn in time (the turn stays queued)
  130  interrupted (Ctrl-C); a followed turn goes on

With --follow, a turn that no live worker takes is said to wait (on stderr; with --json, a
{{"notice": "waiting", ...}} line) and followed until a worker starts it. `events --follow`
and the follow of run and turn ride out a Redis outage, resuming after the last event seen.
"""
RETRY_S = 1.0
"""How often a follow tries Redis again during an outage."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"harness: error: {message}\n")


def _utf8(data: bytes, what: str) -> str:
    """Bytes as text, or InvalidInput naming ``what``: invalid UTF-8 is refused, not replaced."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{what} is not valid UTF-8 text (byte 0x{data[exc.start]:02x} at byte {exc.start})"
        ) from None


def _text_arg(value: str | None, what: str) -> str:
    if value is None or value == "-":
        return _utf8(sys.stdin.buffer.read(), f"the {what} on standard input")
    return value


def _system_prompt(value: str | None) -> str | None:
    if value and value.startswith("@"):
        try:
            data = Path(value[1:]).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"cannot read the system prompt file {value[1:]!r}: {exc}") from exc
        return _utf8(data, f"the system prompt file {value[1:]!r}")
    return value


_POSITIONAL = {
    "harness": "the harness name",
    "prompt": "the prompt",
    "input": "the input",
    "run_id": "the run id",
}


def _check_utf8_args(args: argparse.Namespace) -> None:
    """Refuse argv text that is not UTF-8, naming the argument.

    Python decodes argv with ``surrogateescape``: a byte that is not UTF-8 arrives as a lone
    surrogate (0xff as U+DCFF), which no harness, Redis key or broker message could carry.
    """
    for dest, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str) or text.isascii():
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                label = _POSITIONAL.get(dest) or "--" + dest.replace("_", "-")
                raise InvalidInput(f"{label} {not_utf8(text, exc)}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harness",
        description="Run coding-agent CLIs as sandboxed Celery work.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def output_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="one JSON object per line")

    def follow_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--follow", action="store_true", help="stream this turn's events until it ends"
        )
        p.add_argument(
            "--wait",
            type=float,
            metavar="SECONDS",
            help=(
                "with --follow: give up (exit status "
                f"{TurnWaitTimeout.exit_code}) if no worker has started the turn within "
                "SECONDS; the turn stays queued"
            ),
        )

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
    follow_flags(run)
    output_flags(run)

    turn = sub.add_parser("turn", help="submit the next turn of a run")
    turn.add_argument("run_id")
    turn.add_argument("input", nargs="?", default="-")
    follow_flags(turn)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "wait", None) is not None and (not args.follow or not args.wait > 0):
        parser.error("--wait SECONDS needs --follow and a number of seconds above 0")
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

        report = reap_here()
        lines = report.lines()
        for line in lines:
            print(json.dumps({"removed": line}) if args.json else line)
        for problem in report.unreachable:
            if args.json:
                print(json.dumps({"unreachable": problem}))
            print(f"harness: cannot reap sandboxes: {problem}", file=sys.stderr)
        if not lines and not report.unreachable and not args.json:
            print("nothing to reap")
        return 1 if report.unreachable else 0

    from worker.client import HarnessClient

    _check_utf8_args(args)
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
        return _follow(client, renderer, run_id, 1, args.wait) if args.follow else 0
    if args.command == "turn":
        text = _text_arg(args.input, "input")
        number = client.submit_turn(args.run_id, text)
        renderer.accepted(args.run_id, number)
        return _follow(client, renderer, args.run_id, number, args.wait) if args.follow else 0
    if args.command == "events":
        if not args.follow:
            for event in client.events(args.run_id, after=args.after):
                renderer.event(event)
            return 0
        for item in _resuming(
            client,
            renderer,
            lambda after: client.events(args.run_id, after=after, follow=True),
            args.after,
        ):
            renderer.event(item)
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
        record = client.end(args.run_id, on_wait=renderer.notice)
        note = record.get("last_error") or ""
        text = f"run ended ({note})" if note.startswith("end:") else "run ended"
        renderer.message({"run_id": args.run_id, "status": record["status"], "note": note}, text)
        return 0
    raise AssertionError(args.command)


def _follow(client: Any, renderer: Renderer, run_id: str, turn: int, wait: float | None) -> int:
    from worker.client import Waiting

    deadline = None if wait is None else time.monotonic() + wait

    def open_(after: str | None) -> Iterator[Any]:
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        return client.follow(run_id, turn, after=after, wait=left)  # type: ignore[no-any-return]

    terminal = None
    try:
        for item in _resuming(client, renderer, open_, None):
            if isinstance(item, Waiting):
                renderer.notice(item.as_dict())
                continue
            renderer.event(item)
            if item.terminal and item.turn == turn:
                terminal = item
    except TurnWaitTimeout as exc:
        renderer.close()
        print(f"harness: {exc}: `harness cancel {run_id}` withdraws it", file=sys.stderr)
        return exc.exit_code
    renderer.summary(client.status(run_id), terminal)
    if terminal is not None and terminal.type == "turn-complete":
        return 0
    if terminal is not None and terminal.data.get("reason") == "invalid-input":
        return 2  # refused by the worker's policy: the same answer as a refusal up front
    return 1


def _resuming(
    client: Any,
    renderer: Renderer,
    open_: Callable[[str | None], Iterator[Any]],
    after: str | None,
) -> Iterator[Any]:
    """Items of ``open_(after)``; through a Redis outage, said on stderr, it waits for Redis
    and opens again after the last event seen (no gap, no duplicate)."""
    from worker.client import StreamEvent

    cursor = after
    while True:
        try:
            for item in open_(cursor):
                if isinstance(item, StreamEvent):
                    cursor = item.id
                yield item
            return
        except Unavailable as exc:
            renderer.outage(str(exc))
            while True:
                time.sleep(RETRY_S)
                try:
                    client.ping()
                    break
                except Unavailable:
                    continue
            renderer.recovered(cursor)


if __name__ == "__main__":
    sys.exit(main())
