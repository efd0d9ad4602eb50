"""worker.permissions.rules: a run's --allow/--deny patterns against permission requests."""

from __future__ import annotations

import pytest

from adapters.asks import Ask
from worker.permissions.rules import decide, matches


def ask(tool: str, command: str | None = None, value: object = None) -> Ask:
    return Ask(native_id=1, tool=tool, input=value or {"command": command}, command=command)


@pytest.mark.parametrize(
    ("pattern", "call", "expected"),
    [
        ("Bash", ask("Bash", "rm -rf /"), True),
        ("bash", ask("shell", "ls"), True),  # codex's name for the same tool
        ("Bash", ask("execute", "ls"), True),  # ACP's kind
        ("Bash", ask("run_shell_command", "ls"), True),  # gemini
        ("Bash(git status)", ask("bash", "git status"), True),
        ("Bash(git status)", ask("bash", "git status --porcelain"), False),
        ("Bash(git status:*)", ask("bash", "git status --porcelain"), True),
        ("Bash(npm *)", ask("bash", "rm -rf node_modules"), False),
        ("edit", ask("Edit", value={"path": "a.py"}), True),
        ("edit(*a.py*)", ask("edit", value={"path": "a.py"}), True),
        ("edit", ask("bash", "ed a.py"), False),
        ("Bash(", ask("bash", "ls"), False),  # not a pattern: matches nothing
    ],
)
def test_patterns_name_tools_as_any_cli_does(pattern: str, call: Ask, expected: bool) -> None:
    assert matches(pattern, call) is expected


def test_deny_wins_over_allow_and_says_which_rule() -> None:
    request = ask("bash", "git push --force")
    assert decide(("Bash(git *)",), ("Bash(git push:*)",), request) == (
        False,
        "rule:deny:Bash(git push:*)",
    )
    assert decide(("Bash(git *)",), (), request) == (True, "rule:allow:Bash(git *)")
    assert decide((), (), request) is None
