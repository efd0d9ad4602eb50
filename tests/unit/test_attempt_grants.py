"""A group of attempts over several harnesses gives each the grants the operator allows its
own CLI (HARNESS_GRANTS): one ``--grant`` list for claude-code and codex works."""

from __future__ import annotations

import pytest

from config import load_settings
from worker.client.attempts import per_harness_grants, spread
from worker.errors import InvalidInput

KEYS = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]


def test_each_harness_gets_the_keys_its_cli_may_take() -> None:
    given = per_harness_grants(["claude-code", "codex", "claude-code"], KEYS, load_settings())
    assert given == {"claude-code": ["ANTHROPIC_API_KEY"], "codex": ["OPENAI_API_KEY"]}


def test_one_harness_keeps_its_grants_as_a_run_would() -> None:
    assert per_harness_grants(["codex", "codex"], KEYS, load_settings()) == {"codex": KEYS}


def test_a_grant_no_harness_may_take_is_refused() -> None:
    with pytest.raises(InvalidInput, match="'AWS_SECRET' is allowed for none of claude-code"):
        per_harness_grants(["claude-code", "codex"], [*KEYS, "AWS_SECRET"], load_settings())


def test_lists_spread_round_robin() -> None:
    assert spread("a,b", 5) == ["a", "b", "a", "b", "a"]
    assert spread(None, 2) == [None, None]
    with pytest.raises(InvalidInput):
        spread(" , ", 2)
