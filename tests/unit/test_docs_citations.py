"""The docs stand alone: every document a page of docs/ or the README cites, and every file of
ours it names in prose, is in the repository (a reader cannot follow "DESIGN.md principle 5"
to a file that is not there). Paths in backticks and links are checked by test_docs.py too."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

CITED = re.compile(
    r"(?<![\w/.:-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:md|py|toml|ya?ml|json|sh|lua|txt|cfg|ini))\b"
)
"""A file name as prose cites it: ``DESIGN.md``, ``worker/app.py``, ``docs/events.md``."""
PLACEHOLDER = re.compile(r"[<>*{}]|NEW|new_harness|\.\.\.|^https?:")


def tracked() -> list[str]:
    return subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


def top_folders(files: list[str]) -> set[str]:
    return {path.split("/")[0] for path in files if "/" in path}


def found(cited: str, page: Path, files: list[str]) -> bool:
    """Whether ``cited`` names a file of the repository: from its root, from the page, or
    (a bare or partial path) as the end of a tracked path."""
    if (ROOT / cited).exists() or (page.parent / cited).exists():
        return True
    return any(path == cited or path.endswith("/" + cited) for path in files)


def cited_files(text: str, tops: set[str]) -> list[str]:
    """The documents (``*.md``) a text cites, and the paths into a folder of ours it names
    (a file a vendor or a command of the page writes, ``opencode.json``, is not ours)."""
    text = re.sub(r"https?://\S+", "", text)  # a URL's path is another site's
    return [
        name
        for name in CITED.findall(text)
        if not PLACEHOLDER.search(name)
        and (name.endswith(".md") or ("/" in name and name.split("/")[0] in tops))
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_file_a_doc_cites_is_in_the_repository(page: Path) -> None:
    files = tracked()
    cited = cited_files(page.read_text(), top_folders(files))
    missing = sorted({name for name in cited if not found(name, page, files)})
    assert missing == [], f"{page.name} cites files the repository does not have"


def test_a_citation_of_a_missing_file_is_caught() -> None:
    page, files = ROOT / "docs" / "adapters.md", tracked()
    text = (
        "as DESIGN.md principle 5 says, worker/app.py shows and worker/gone.py showed "
        "(see events.md; the model is in opencode.json)"
    )
    names = cited_files(text, top_folders(files))
    assert names == ["DESIGN.md", "worker/app.py", "worker/gone.py", "events.md"]
    missing = [name for name in names if not found(name, page, files)]
    assert missing == ["DESIGN.md", "worker/gone.py"]


VENDOR_FILES = {"AGENTS.md", "CLAUDE.md", "GEMINI.md"}
"""Files the CLIs read in a workspace: named in code, never cited."""
SOURCES = ("adapters", "sandbox", "worker", "config", "harnesses", "bench", "scripts", "tests")


def source_files(files: list[str]) -> list[str]:
    """Our code, scripts and test data: what a reader of the code follows a citation from."""
    return [
        path
        for path in files
        if path.split("/")[0] in SOURCES
        and (path.endswith((".py", ".json", ".lua", ".sh", ".toml")) or path.startswith("scripts/"))
    ]


def test_code_cites_only_documents_the_repository_holds() -> None:
    files = tracked()
    missing = {}
    for path in source_files(files):
        if path in ("tests/unit/test_docs_citations.py", "tests/unit/test_docs.py"):
            continue  # their own examples and checks name missing documents on purpose
        text = (ROOT / path).read_text(errors="replace")
        cited = [
            name for name in CITED.findall(re.sub(r"https?://\S+", "", text))
            if name.endswith(".md") and not PLACEHOLDER.search(name) and name not in VENDOR_FILES
        ]  # fmt: skip
        gone = sorted({name for name in cited if not found(name, ROOT / path, files)})
        if gone:
            missing[path] = gone
    assert missing == {}, "code cites documents the repository does not have"


def test_code_names_no_path_outside_the_repository() -> None:
    files = tracked()
    outside = [
        path
        for path in source_files(files)
        if "/work/" + "shared" in (ROOT / path).read_text(errors="replace")
    ]
    assert outside == []
