"""The ``harness`` command (docs/events.md, "The command line: exit statuses"; `harness --help`)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import adapters
from adapters import HARNESS_IDS
from config import SettingsError
from worker.cli import attach as cli_attach
from worker.cli import control as cli_control
from worker.cli import outcome as cli_outcome
from worker.cli import permissions as cli_permissions
from worker.cli import schedules as cli_schedules
from worker.cli import spend as cli_spend
from worker.cli import tenant as cli_tenant
from worker.cli import tools as cli_tools
from worker.cli import triggers as cli_triggers
from worker.cli import workspace as cli_workspace
from worker.cli.render import Renderer
from worker.cli.session import Handler, Session
from worker.errors import (
    HarnessError,
    InvalidInput,
    RunNotFound,
    StreamLost,
    TurnWaitTimeout,
    Unavailable,
)
from worker.observe import tracing
from worker.options.policy import not_utf8
from worker.options.spec import parse_label

EXIT_STATUSES = f"""\
exit status:
  0    done (with --follow: the turn completed; without: the turn was accepted)
  1    the turn failed, the run is unknown, or Redis or the broker cannot be reached
       (reap: a sandbox backend could not be asked; doctor: a check failed); with
       --follow also: the run was lost (Redis lost its data: "harness: run ... is lost")
  2    bad usage, or refused: invalid input (text that is not UTF-8 included), unknown
       harness, beyond operator policy, a turn already in flight, the run has ended
  {TurnWaitTimeout.exit_code}  --wait: no worker started the turn in time (the turn stays queued)
  130  interrupted (Ctrl-C); a followed turn goes on

With --follow, a turn that no live worker takes is said to wait (on stderr; with --json, a
{{"notice": "waiting", ...}} line) and followed until a worker starts it. `events --follow`
ends when the run ends (status ended or failed) or its keys are gone. `events --follow` and
the follow of run and turn ride out a Redis outage, resuming after the last event seen. A
follow whose run is gone from Redis without an end (a Redis restarted without persistence,
flushed or evicting) says the run is lost and exits 1 (docs/operations.md).
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


RUN_DESCRIPTION = f"""\
Start a run of HARNESS and send it its first turn. The run id is printed alone on the first
line of stdout (scripts read it); with --follow the turn's events follow.

harnesses: {", ".join(HARNESS_IDS)}
  (stdio-json runs your own executable: --executable PATH, allowed by the operator)
"""
OPERATOR_BOUND = "within the operator's policy"
HELP_WIDTH = 92
_RUN_EXITS = (
    "0 accepted (with --follow: the turn completed), 1 the turn failed or Redis or the "
    "broker cannot be reached, 2 bad usage or refused, "
    f"{TurnWaitTimeout.exit_code} --wait ran out, 130 interrupted"
)
_RECORD_EXITS = "0 done, 1 unknown run or Redis unreachable, 2 bad usage (an invalid run id)"
COMMAND_EXITS = {
    "run": _RUN_EXITS,
    "turn": _RUN_EXITS + "; 1 also an unknown run, 2 also a turn in flight or an ended run",
    "fork": _RUN_EXITS + "; 1 also an unknown run or a turn without a snapshot, 2 also a "
    "turn the run has not finished",
    "events": _RECORD_EXITS + " or event id",
    "status": _RECORD_EXITS,
    "cancel": _RECORD_EXITS,
    "end": _RECORD_EXITS,
    "reap": "0 done, 1 a sandbox backend could not be asked",
    "doctor": "0 every check passed (warnings allowed), 1 a check failed",
    **cli_control.EXITS,
    **cli_workspace.EXITS,
    **cli_spend.EXITS,
    **cli_permissions.EXITS,
    **cli_tenant.EXITS,
    **cli_tools.EXITS,
    **cli_schedules.EXITS,
    **cli_triggers.EXITS,
}
"""Each command's exit statuses, in its own --help (EXIT_STATUSES has them all)."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harness",
        description="Run coding-agent CLIs as sandboxed Celery work.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    command = functools.partial(_add_command, sub)
    _add_run(command)
    _add_turn(command)
    _add_fork(command)
    _add_reading(command)
    _add_stopping(command)
    cli_control.add_commands(command, _add_run_id)
    cli_workspace.add_commands(command, _add_run_id)
    cli_spend.add_commands(command, _add_run_id, OPERATOR_BOUND)
    cli_permissions.add_commands(command, _add_run_id)
    cli_tenant.add_commands(command)
    cli_tools.add_commands(command)
    cli_schedules.add_commands(command, _parse_run)
    cli_triggers.add_commands(command)
    _add_operating(command)
    return parser


Command = Callable[..., argparse.ArgumentParser]
"""``command(name, text, description=None)``: a new subcommand's parser, its help and exit
statuses written (what every ``add_commands`` is given)."""


def _add_command(
    sub: argparse._SubParsersAction[_Parser], name: str, text: str, description: str | None = None
) -> argparse.ArgumentParser:
    description = description or text[0].upper() + text[1:] + "."
    if "\n" not in description:
        description = textwrap.fill(description, HELP_WIDTH)
    return sub.add_parser(
        name,
        help=text,
        description=description,
        epilog=textwrap.fill(f"exit status: {COMMAND_EXITS[name]}", HELP_WIDTH)
        + "\n(all of them: harness --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_run_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID", help="the run id ('r' and 24 hex digits)")


def _add_json(p: argparse.ArgumentParser, what: str = "one JSON object per line") -> None:
    p.add_argument("--json", action="store_true", help=what)


def _add_follow(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--follow",
        action="store_true",
        help="stream this turn's events until its terminal event; the exit status is "
        "then the turn's (0 completed, 1 failed)",
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


def _add_idempotency_key(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help=f"run again with the same KEY (within HARNESS_IDEMPOTENCY_TTL_S), it prints the "
        f"first {what} and starts nothing new; the same KEY with another request is refused "
        "(exit status 2)",
    )


def _add_run(command: Command) -> None:
    run = command("run", "start a run and its first turn", RUN_DESCRIPTION)
    run.add_argument(
        "harness",
        metavar="HARNESS",
        help="one of: " + ", ".join(HARNESS_IDS) + " (with --attempts, also H1,H2,...: "
        "spread over the attempts, as --model M1,M2 is)",
    )
    run.add_argument(
        "--attempts",
        type=int,
        metavar="N",
        help="start N runs of the prompt side by side under one group (1 to 16), each in its "
        "own sandbox; prints the group id, then each run id (harness attempts GROUP compares "
        "them, harness pick GROUP N keeps one)",
    )
    run.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        default="-",
        help="the first turn's input; - (or nothing) reads it from standard input",
    )
    _add_harness_options(run)
    _add_sandbox_options(run)
    cli_workspace.add_seed_options(run, OPERATOR_BOUND)
    cli_attach.add_options(run, OPERATOR_BOUND)
    cli_spend.add_run_options(run, OPERATOR_BOUND)
    cli_tenant.add_run_options(run)
    cli_tools.add_run_options(run)
    cli_outcome.add_run_options(run)
    _add_idempotency_key(run, "run id")
    _add_follow(run)
    _add_json(run, "one JSON object per line: {run_id, turn}, then the events")


def _add_harness_options(run: argparse.ArgumentParser) -> None:
    """What ``run`` asks of the harness: its prompt, model and permissions."""
    run.add_argument(
        "--system-prompt",
        metavar="TEXT",
        help="a system prompt, or @FILE to read it from a file (through the harness's own "
        "system-prompt channel where it has one, else before the input)",
    )
    run.add_argument(
        "--model",
        metavar="MODEL",
        help="the model to ask the harness for (a warning when the harness has no model "
        "selection); the record keeps the model it reports using",
    )
    run.add_argument(
        "--posture",
        choices=("strict", "auto", "dangerous", "ask"),
        help="what the harness may do unasked: strict (nothing), auto (edits and safe "
        "commands; the default), dangerous (everything, inside its container), ask (what "
        "the rules do not settle waits for `harness approve` or `harness deny`)",
    )
    run.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a tool pattern the harness may use without asking (repeatable)",
    )
    run.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a tool pattern the harness must not use (repeatable)",
    )
    run.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="NAME",
        help="an environment variable the worker passes from its own secrets into the "
        f"sandbox, {OPERATOR_BOUND} (repeatable)",
    )


def _add_sandbox_options(run: argparse.ArgumentParser) -> None:
    """Where and how ``run``'s harness runs: sandbox, image, network, session, limits."""
    run.add_argument(
        "--sandbox",
        choices=("docker", "local"),
        help=f"where the harness runs (default: the worker's HARNESS_SANDBOX), {OPERATOR_BOUND}",
    )
    run.add_argument(
        "--image", help=f"the container image (default: the harness's own), {OPERATOR_BOUND}"
    )
    run.add_argument(
        "--network",
        choices=("none", "bridge", "host", "egress"),
        help="the container's network (default: HARNESS_NETWORK); egress: only the hosts of "
        f"the run's allowlist, through the egress gateway; {OPERATOR_BOUND}",
    )
    run.add_argument(
        "--resume-session",
        metavar="VENDOR_SESSION_ID",
        help="continue this vendor session (a prior run's session_id); the session event "
        "says whether it really resumed",
    )
    run.add_argument(
        "--base-url",
        metavar="URL",
        help="send the harness's model traffic here (a gateway, proxy or self-hosted model), "
        "as the vendor's SDK writes it (ending in /v1 for OpenAI-style APIs)",
    )
    run.add_argument(
        "--fallback-model",
        metavar="MODEL",
        action="append",
        default=None,
        help="when the model fails (5xx, 529), the model gateway asks this one instead "
        "(repeatable: in turn); a sandbox-activity event says which model served",
    )
    run.add_argument(
        "--executable",
        metavar="PATH",
        help=f"the harness program (stdio-json only, and required there), {OPERATOR_BOUND}",
    )
    run.add_argument(
        "--workspace",
        metavar="NAME",
        help="a durable workspace shared across runs (default: the run's own, removed at end)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"each turn's wall-clock limit (default: HARNESS_TURN_TIMEOUT_S), {OPERATOR_BOUND}",
    )
    run.add_argument(
        "--memory",
        metavar="SIZE",
        help=f"container memory limit, e.g. 512m or 2g, {OPERATOR_BOUND}",
    )
    run.add_argument(
        "--cpus", type=float, metavar="N", help=f"container CPU limit, {OPERATOR_BOUND}"
    )
    run.add_argument(
        "--pids", type=int, metavar="N", help=f"container process limit, {OPERATOR_BOUND}"
    )


def _add_turn(command: Command) -> None:
    turn = command(
        "turn",
        "submit the next turn of a run",
        "Submit the next turn of an idle run (refused, exit status 2, while a turn is in "
        "flight or once the run has ended).",
    )
    _add_run_id(turn)
    turn.add_argument(
        "input",
        metavar="INPUT",
        nargs="?",
        default="-",
        help="the turn's input; - (or nothing) reads it from standard input",
    )
    cli_attach.add_options(turn, OPERATOR_BOUND, turn=True)
    _add_idempotency_key(turn, "turn number")
    _add_follow(turn)
    _add_json(turn, "one JSON object per line: {run_id, turn}, then the events")


def _add_fork(command: Command) -> None:
    fork = command(
        "fork",
        "start a new run from another's turn",
        "Start a new run whose workspace is RUN_ID's snapshot after turn --at-turn (default: "
        "its last finished turn; 0: its seed) and whose conversation continues from there "
        "(the turns up to it replayed into the new run's first turn, reported as usage of "
        "source replay); its first turn starts with INPUT. Prints the new run id on the "
        "first line. The new run keeps RUN_ID's options and tenant, not its durable "
        "workspace, branch or seed; --harness and --model run it otherwise.",
    )
    _add_run_id(fork)
    # Required, so that options may come before it (`fork RUN --at-turn 2 "try again"`):
    # argparse gives an optional positional nothing when an option follows the run id.
    fork.add_argument(
        "input", metavar="INPUT", help="the new run's first turn; - reads it from standard input"
    )
    fork.add_argument("--at-turn", type=int, metavar="K", help="the turn to fork after")
    fork.add_argument("--harness", choices=HARNESS_IDS, help="run the fork with another harness")
    fork.add_argument("--model", metavar="M", help="run the fork with another model")
    fork.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE",
        help="a label of the new run (repeatable), besides its parent's",
    )  # fmt: skip
    _add_follow(fork)
    _add_json(fork, "one JSON object per line: {run_id, turn}, then the events")


def _add_reading(command: Command) -> None:
    """``events`` and ``status``."""
    events = command(
        "events",
        "print a run's events",
        "Print a run's events, oldest first. With --follow, wait for new ones until the run "
        "ends (status ended or failed, its last turn's terminal event printed) or its keys "
        "are gone; a Redis outage is ridden out.",
    )
    _add_run_id(events)
    events.add_argument(
        "--after",
        metavar="ID",
        help="only events after this entry id (TURN-SEQ, like 3-0): resume where you left off",
    )
    events.add_argument(
        "--follow",
        action="store_true",
        help="wait for new events until the run ends (ended or failed) or is gone",
    )
    _add_json(events, "one JSON object per line: id, type, data, ts")

    status = command(
        "status",
        "print the run record",
        "Print the run record: its status first, then the rest; times as local dates with "
        "their distance from now.",
    )
    _add_run_id(status)
    _add_json(status, "the record as one JSON object, typed (numbers, booleans, null)")


def _add_stopping(command: Command) -> None:
    """``cancel`` and ``end``."""
    cancel = command(
        "cancel",
        "stop the in-flight turn",
        "Stop the run's in-flight turn (it ends with a session-error of reason cancelled); "
        "says so when nothing is in flight.",
    )
    _add_run_id(cancel)
    _add_json(cancel, "one JSON object: {run_id, cancelled}")
    end = command(
        "end",
        "tear the run down",
        "Tear the run down: its process, container, workspace (unless durable) and "
        "credential. Idempotent.",
    )
    _add_run_id(end)
    _add_json(end, "one JSON object: {run_id, status, note}")


def _add_operating(command: Command) -> None:
    """``reap`` and ``doctor``: the operator's commands, which need no run."""
    reap = command("reap", "remove sandboxes whose run is gone or whose lease expired")
    _add_json(reap, 'one JSON object per line: {"removed": ...} or {"unreachable": ...}')
    doctor = command("doctor", "check broker, Redis, Docker, images and harnesses")
    _add_json(doctor, "one JSON object: ok, checks, capabilities")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "wait", None) is not None and (not args.follow or not args.wait > 0):
        parser.error("--wait SECONDS needs --follow and a number of seconds above 0")
    # The command says what went wrong itself; the worker code it runs (reap, doctor) logs
    # only what it could not say: errors, as key=value lines on stderr.
    logging.basicConfig(level=logging.ERROR, format="harness: %(levelname)s %(message)s")
    tracing.setup(SERVICES.get(args.command, "harness"))  # on with OTEL_EXPORTER_OTLP_ENDPOINT
    try:
        _check_utf8_args(args)
        with _command_span(args.command):
            return HANDLERS[args.command](args, Session(args))
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
    finally:
        tracing.flush()  # a short-lived process: its batch would die with it


def _command_span(command: str) -> contextlib.AbstractContextManager[object]:
    """The command's span; none around a server's life (its requests are traces of their
    own)."""
    if command in SERVERS:
        return contextlib.nullcontext()
    return tracing.span(f"harness {command}")


def _doctor(args: argparse.Namespace, session: Session) -> int:
    from worker.cli.doctor import run_doctor

    return run_doctor(json_output=args.json)


def _reap(args: argparse.Namespace, session: Session) -> int:
    from worker import runtime
    from worker.fleet.lifecycle import reap_here

    report = reap_here(runtime.deps())
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


def _run(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    prompt = _text_arg(args.prompt, "prompt")
    options = run_options(args)
    if args.attempts is not None:
        return _run_attempts(args, session, prompt, options)
    run_id = client.start_run(args.harness, prompt, **options, idempotency_key=args.idempotency_key)
    for warning in _ignored_options(args, client.settings.sandbox):
        print(f"harness: warning: {warning}", file=sys.stderr)
    renderer.accepted(run_id, 1)
    return _follow(client, renderer, run_id, 1, args.wait) if args.follow else 0


def _parse_run(rest: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """``harness run REST`` parsed: its arguments and the client's run options."""
    run = build_parser().parse_args(["run", *rest])
    return run, run_options(run)


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The client's run options from ``run``'s arguments (``schedule add`` takes them too)."""
    return dict(
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
        fallback_models=args.fallback_model,
        executable=args.executable,
        timeout_s=args.timeout,
        workspace=args.workspace,
        memory=args.memory,
        cpus=args.cpus,
        pids=args.pids,
        **cli_workspace.seed_options(args),
        **cli_attach.options(args),
        **cli_spend.run_options(args),
        **cli_tenant.run_options(args),
        **cli_tools.run_options(args),
        **cli_outcome.run_options(args),
    )


def _run_attempts(
    args: argparse.Namespace, session: Session, prompt: str, options: dict[str, Any]
) -> int:
    """``run --attempts N``: the group id on the first line, then each run id; with
    --follow, each attempt's first turn in turn (the exit status: 0 when all completed)."""
    client, renderer = session.client, session.renderer
    if args.idempotency_key is not None:
        raise InvalidInput("--idempotency-key is for one run, not a group of attempts")
    started = client.start_attempts(args.harness, prompt, attempts=args.attempts, **options)
    renderer.message(started, "\n".join([started["group"], *started["runs"]]))
    if not args.follow:
        return 0
    worst = 0
    for run_id in started["runs"]:
        worst = max(worst, _follow(client, renderer, run_id, 1, args.wait))
    return worst


def _turn(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    text = _text_arg(args.input, "input")
    number = client.submit_turn(
        args.run_id, text, **cli_attach.options(args), idempotency_key=args.idempotency_key
    )
    renderer.accepted(args.run_id, number)
    return _follow(client, renderer, args.run_id, number, args.wait) if args.follow else 0


def _fork(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    text = _text_arg(args.input, "input")
    labels = dict(parse_label(item) for item in args.label)
    run_id = client.fork(
        args.run_id, text, at_turn=args.at_turn, harness=args.harness, model=args.model,
        labels=labels,
    )  # fmt: skip
    renderer.accepted(run_id, 1)
    return _follow(client, renderer, run_id, 1, args.wait) if args.follow else 0


def _events(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    if not args.follow:
        for event in client.events(args.run_id, after=args.after):
            renderer.event(event)
        return 0
    for item in _resuming(
        client,
        renderer,
        args.run_id,
        lambda after: _events_until_run_ends(client, args.run_id, after),
        args.after,
    ):
        renderer.event(item)
    return 0


def _status(args: argparse.Namespace, session: Session) -> int:
    session.renderer.record(session.client.status(args.run_id))
    return 0


def _cancel(args: argparse.Namespace, session: Session) -> int:
    cancelled = session.client.cancel(args.run_id)
    session.renderer.message(
        {"run_id": args.run_id, "cancelled": cancelled},
        "cancel requested" if cancelled else "nothing in flight",
    )
    return 0


def _end(args: argparse.Namespace, session: Session) -> int:
    record = session.client.end(args.run_id, on_wait=session.renderer.notice)
    note = record.get("last_error") or ""
    text = f"run ended ({note})" if note.startswith("end:") else "run ended"
    session.renderer.message(
        {"run_id": args.run_id, "status": record["status"], "note": note}, text
    )
    return 0


SERVERS = frozenset({"api", "tools"})
"""Commands that serve until stopped: no span of the command around them."""
SERVICES = {"api": "harness-api", "tools": "harness-tools"}
"""The traces' service name of a command's process (default ``harness``)."""

HANDLERS: dict[str, Handler] = {
    "run": _run,
    "turn": _turn,
    "fork": _fork,
    "events": _events,
    "status": _status,
    "cancel": _cancel,
    "end": _end,
    **cli_control.HANDLERS,
    **cli_workspace.HANDLERS,
    **cli_spend.HANDLERS,
    **cli_permissions.HANDLERS,
    **cli_tenant.HANDLERS,
    **cli_tools.HANDLERS,
    **cli_schedules.HANDLERS,
    **cli_triggers.HANDLERS,
    "reap": _reap,
    "doctor": _doctor,
}
"""Every command by name: the one place a command is dispatched (each module of
``worker.cli`` adds its own)."""


def _ignored_options(args: argparse.Namespace, default_sandbox: str) -> list[str]:
    """Options this run would silently ignore, each said as a warning."""
    warnings = []
    if (
        args.model
        and args.harness in HARNESS_IDS
        and not adapters.capabilities(args.harness)["model_selection"]
    ):
        warnings.append(
            f"{args.harness} has no model selection: --model {args.model} is not passed "
            "to the harness (the run record keeps it as model_requested)"
        )
    if (args.sandbox or default_sandbox) == "local":
        ignored = [
            f"--{name}"
            for name in ("image", "network", "memory", "cpus", "pids")
            if getattr(args, name) is not None
        ]
        if ignored:
            warnings.append(
                f"the local sandbox ignores {', '.join(ignored)} (a process on the worker's "
                "machine: no container, no limits, no network policy)"
            )
    return warnings


def _events_until_run_ends(client: Any, run_id: str, after: str | None) -> Iterator[Any]:
    """The run's events after ``after`` as they come, until the run's stream has ended
    (``HarnessClient.follow_run``: ended or failed, every event read, or its keys gone)."""
    return client.follow_run(run_id, after=after)  # type: ignore[no-any-return]


def _follow(client: Any, renderer: Renderer, run_id: str, turn: int, wait: float | None) -> int:
    """Follow ``turn`` to its terminal, and on through the turns a park sends again (a
    ``parked`` event names the next turn: the same input, at the reset); the exit status is
    the last turn's."""
    while True:
        code, parked_as = _follow_turn(client, renderer, run_id, turn, wait)
        if parked_as is None:
            return code
        turn, wait = parked_as, None  # it waits for its reset, not for a worker


def _follow_turn(
    client: Any, renderer: Renderer, run_id: str, turn: int, wait: float | None
) -> tuple[int, int | None]:
    from worker.client import Waiting
    from worker.spend.slots import SlotWaiting

    deadline = None if wait is None else time.monotonic() + wait

    def open_(after: str | None) -> Iterator[Any]:
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        return client.follow(run_id, turn, after=after, wait=left)  # type: ignore[no-any-return]

    terminal, parked_as = None, None
    try:
        for item in _resuming(client, renderer, run_id, open_, None):
            if isinstance(item, Waiting | SlotWaiting):
                renderer.notice(item.as_dict())
                continue
            renderer.event(item)
            if item.type == "parked" and item.turn == turn:
                parked_as = int(item.data["next_turn"])
            if item.terminal and item.turn == turn:
                terminal = item
    except TurnWaitTimeout as exc:
        renderer.close()
        print(f"harness: {exc}: `harness cancel {run_id}` withdraws it", file=sys.stderr)
        return exc.exit_code, None
    if parked_as is not None:
        return 1, parked_as
    renderer.summary(client.status(run_id), terminal)
    if terminal is not None and terminal.type == "turn-complete":
        return 0, None
    if terminal is not None and terminal.data.get("reason") == "invalid-input":
        return 2, None  # refused by the worker's policy: the same answer as a refusal up front
    return 1, None


def _resuming(
    client: Any,
    renderer: Renderer,
    run_id: str,
    open_: Callable[[str | None], Iterator[Any]],
    after: str | None,
) -> Iterator[Any]:
    """Items of ``open_(after)``; through a Redis outage, said on stderr, it waits for Redis
    and opens again after the last event seen (no gap, no duplicate). A run that is gone
    when Redis is back (it restarted without its data) is lost: StreamLost, never a wait."""
    from worker.client import StreamEvent

    cursor = after
    reopened = False
    while True:
        try:
            for item in open_(cursor):
                if isinstance(item, StreamEvent):
                    cursor = item.id
                yield item
            return
        except StreamLost:
            renderer.lost(run_id, cursor)
            raise
        except RunNotFound as exc:
            if not reopened:
                raise
            renderer.lost(run_id, cursor)
            raise StreamLost(run_id) from exc
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
            reopened = True


if __name__ == "__main__":
    sys.exit(main())
