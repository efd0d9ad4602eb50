"""docs/security.md's adversarial table names, for every case, the test that holds it: each
named test exists (a row whose test was renamed or deleted would claim a proof it lacks)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE_START = "## The adversarial table"


def table_rows() -> list[str]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text[text.index(TABLE_START) :]
    section = section[: section.index("\n## ", 1)]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def _test_file(name: str) -> Path:
    found = [p for p in (ROOT / "tests").rglob(Path(name).name) if str(p).endswith(name)]
    assert len(found) == 1, f"{name}: {len(found)} files"
    return found[0]


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def named_tests() -> list[tuple[str, str]]:
    """(file, test) for every test a row names; ``…::name`` and ``::name`` continue the file
    last named in the row (or the row above)."""
    named, current = [], ""
    for row in table_rows()[1:]:
        cell = row.rstrip(" |").rsplit(" | ", 1)[-1]
        for match in re.finditer(r"`([^`]*::[^`]*)`", cell):
            ref = match.group(1)
            path, _, test = ref.partition("::")
            path = path.lstrip("…")
            if path:
                current = path
            named.append((current, test.split("[")[0]))
    return named


def test_the_table_names_a_test_for_every_case() -> None:
    rows = table_rows()[1:]
    assert len(rows) >= 50
    # A test (`FILE::NAME`, `::NAME`), or another case of the row above's (`…[CASE]`).
    proofs = [row.rstrip(" |").rsplit(" | ", 1)[-1] for row in rows]
    assert [p for p in proofs if "::" not in p and "`…[" not in p] == []


def test_every_test_the_table_names_exists() -> None:
    missing = []
    for file, test in named_tests():
        assert file, f"{test}: no file named before it"
        if test not in defined_tests(_test_file(file)):
            missing.append(f"{file}::{test}")
    assert missing == []
