"""The `harness` command explains itself: help for every option, the harness ids, the exit
statuses, warnings for options a run would ignore, validation errors in words, and an
`events --follow` said to end with the run (its end: tests/security/test_turn_races.py)."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from adapters import HARNESS_IDS
from worker.cli import main as cli
from worker.errors import InvalidInput
from worker.options.spec import _EXPECTED_FORM, RunOptions, parse_options

RUN_ID = "r" + "b" * 24


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def help_of(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_option_and_argument_of_every_command_has_help_text() -> None:
    commands = subparsers(cli.build_parser())
    assert set(commands) >= {
        "run",
        "turn",
        "events",
        "status",
        "cancel",
        "end",
        "reap",
        "doctor",
        "diff",
        "export",
        "rewind",
    }
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in commands.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_every_command_has_a_description_and_its_exit_statuses() -> None:
    for name, parser in subparsers(cli.build_parser()).items():
        assert parser.description, name
        assert parser.epilog and "exit status: 0" in parser.epilog, name


def test_run_help_lists_the_harness_ids_and_says_what_a_dash_means(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(help_of("run", capsys=capsys).split())
    for harness in HARNESS_IDS:
        assert harness in text
    assert "- (or nothing) reads it from standard input" in text
    assert "- (or nothing) reads it from standard input" in " ".join(
        help_of("turn", capsys=capsys).split()
    )


def test_top_level_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(capsys=capsys)
    codes = re.findall(r"^  ([0-9]+) ", text.split("exit status:")[1], re.MULTILINE)
    assert codes == ["0", "1", "2", "124", "130"]


def test_events_help_says_follow_ends_with_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_of("events", capsys=capsys).split())
    assert "until the run ends (ended or failed) or is gone" in text


# -- options a run would ignore are warnings ------------------------------------------------


def run_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", *argv])


def test_model_on_a_harness_without_model_selection_is_a_warning() -> None:
    args = run_args("stdio-json", "hi", "--executable", "harness-demo", "--model", "m1")
    (warning,) = cli._ignored_options(args, "docker")
    assert warning.startswith("stdio-json has no model selection: --model m1 is not passed")


def test_model_on_a_harness_with_model_selection_is_no_warning() -> None:
    assert cli._ignored_options(run_args("claude-code", "hi", "--model", "m1"), "docker") == []


def test_container_options_on_the_local_sandbox_are_a_warning() -> None:
    args = run_args("pi", "hi", "--memory", "1g", "--network", "none", "--sandbox", "local")
    (warning,) = cli._ignored_options(args, "docker")
    assert warning.startswith("the local sandbox ignores --network, --memory")
    assert cli._ignored_options(run_args("pi", "hi", "--memory", "1g"), "local") != []
    assert cli._ignored_options(run_args("pi", "hi", "--memory", "1g"), "docker") == []


def test_the_warning_is_printed_on_stderr_at_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Client:
        settings = argparse.Namespace(sandbox="local")

        def start_run(self, *args: Any, **kwargs: Any) -> str:
            return RUN_ID

    monkeypatch.setattr("worker.client.HarnessClient", Client)
    assert cli.main(["run", "stdio-json", "hi", "--executable", "x", "--model", "m1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [RUN_ID]
    assert err.startswith("harness: warning: stdio-json has no model selection")


# -- validation in words ----------------------------------------------------------------------

REGEX_BITS = re.compile(r"\^|\$'|\[[0-9A-Za-z]-|\{[0-9]+,[0-9]+\}|should match")


def pattern_fields() -> list[str]:
    return [
        name
        for name, field in RunOptions.model_fields.items()
        if any(getattr(m, "pattern", None) for m in field.metadata)
    ]


def test_every_field_with_a_pattern_says_its_form_in_words() -> None:
    assert pattern_fields()  # memory, workspace today
    assert set(pattern_fields()) <= set(_EXPECTED_FORM)


@pytest.mark.parametrize(
    "options",
    [
        {"memory": "2 gigs"},
        {"workspace": "a b"},
        {"model": "-m"},
        {"model": "a\nb"},
        {"image": "Bad Image"},
        {"resume_session": "-x"},
        {"allow": ("-x",)},
        {"grants": ("1A",)},
        {"base_url": "ftp://x"},
        {"privileged": True},
    ],
    ids=lambda options: next(iter(options)),
)
def test_validation_messages_never_show_a_regular_expression(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_options(harness="pi", **options)
    message = str(refused.value)
    assert message.startswith(f"invalid request: {next(iter(options))}: ")
    assert not REGEX_BITS.search(message), message


def test_memory_refusal_says_what_a_size_looks_like() -> None:
    with pytest.raises(InvalidInput, match=r"'2 gigs' is not a memory size: .* \(512m, 2g\)"):
        parse_options(harness="pi", memory="2 gigs")


# -- events --follow ends with the run --------------------------------------------------------
