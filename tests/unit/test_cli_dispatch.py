"""The ``harness`` command dispatches by one table: every command its parser knows has one
handler and one line of exit statuses, and a handler's status (or typed error) is the
command's; the renderer shows each event type by its own view, from one table too."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from adapters.events import EVENT_TYPES
from worker.cli import main as cli
from worker.cli import render
from worker.cli.session import Session
from worker.errors import RunBusy

CLI = Path(cli.__file__).parent
RUN_ID = "r" + "b" * 24


def commands() -> set[str]:
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_has_one_handler_and_its_exit_statuses() -> None:
    assert set(cli.HANDLERS) == commands()
    assert set(cli.COMMAND_EXITS) == commands()


def test_no_module_of_the_command_line_dispatches_by_if_chain() -> None:
    chains = {
        path.name: len(re.findall(r"args\.command\s*(==|in)\b", path.read_text()))
        for path in CLI.glob("*.py")
    }
    assert {name: n for name, n in chains.items() if n} == {}


def test_main_returns_the_handlers_status(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def status(args: argparse.Namespace, session: Session) -> int:
        seen.append((args.command, args.run_id))
        return 7

    monkeypatch.setitem(cli.HANDLERS, "status", status)
    assert cli.main(["status", RUN_ID]) == 7
    assert seen == [("status", RUN_ID)]


def test_a_handlers_typed_error_is_one_line_and_its_exit_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def cancel(args: argparse.Namespace, session: Session) -> int:
        raise RunBusy(args.run_id, 3)

    monkeypatch.setitem(cli.HANDLERS, "cancel", cancel)
    assert cli.main(["cancel", RUN_ID]) == RunBusy.exit_code
    err = capsys.readouterr().err
    assert err.splitlines() == [f"harness: {RunBusy(RUN_ID, 3)}"]


def test_a_command_that_needs_no_client_makes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """``doctor`` and ``reap`` run where the producer's settings are broken, too."""
    monkeypatch.setenv("HARNESS_REDIS_URL", "notaurl")
    session = Session(argparse.Namespace(command="doctor", json=True))
    assert "client" not in vars(session)
    assert session.renderer.json
    assert "client" not in vars(session)


def test_every_event_type_has_its_own_view() -> None:
    assert set(render._EVENT_VIEWS) == set(EVENT_TYPES)


def test_fork_takes_its_options_before_or_after_its_input() -> None:
    from worker.cli.main import build_parser

    run_id = "r" + "0" * 24
    for argv in (
        ["fork", run_id, "--at-turn", "1", "try again"],
        ["fork", run_id, "try again", "--at-turn", "1"],
    ):
        args = build_parser().parse_args(argv)
        assert (args.run_id, args.at_turn, args.input) == (run_id, 1, "try again")
