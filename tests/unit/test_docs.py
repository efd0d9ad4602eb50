"""The docs are held to the code: the event set and its reasons, the run record's fields, the
exit statuses, the stdio-json protocol, the settings and the files they name."""

from __future__ import annotations

import re
import subprocess
import typing
from pathlib import Path

import pytest

from adapters import events
from worker.cli import main as cli
from worker.store import records

ROOT = Path(__file__).resolve().parents[2]
EVENTS_MD = ROOT / "docs" / "events.md"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

STATUS_ONLY_FIELDS = {"credential_live", "waiting_for_worker"}
"""Fields ``harness status`` adds to the stored record (worker/client/harness.py ``status``)."""
NOT_SETTINGS = {
    "HARNESS_TURN": "adapters/stdio_json.py",  # given to a stdio-json harness
    "HARNESS_RESUME_SESSION": "adapters/stdio_json.py",
    "HARNESS_POSTURE": "adapters/stdio_json.py",  # --posture ask
    "HARNESS_RUN_TOKEN": "worker/store/credentials.py",  # the per-run credential a harness gets
    "HARNESS_ID": "adapters/stdio_json.py",  # an adapter's constant
    "HARNESS_DOCKER2_BRIDGE_CIDR": "scripts/second-dockerd",
    "HARNESS_BENCH_REDIS_URL": "bench/worker.py",
    "HARNESS_ATTACHMENTS": "adapters/stdio_json.py",
    "HARNESS_MCP_CONFIG": "adapters/stdio_json.py",  # the run's MCP servers (--tools, --mcp)
    "HARNESS_PI_MCP": "adapters/pi_mcp.py",
    "HARNESS_MODEL_BASE_URL": "adapters/stdio_json.py",  # the turn's model gateway
}
"""``HARNESS_*`` names the docs use that are not worker settings, and where each lives."""


def section(text: str, name: str) -> str:
    """The text between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""
    return text.split(f"<!-- {name}:begin -->\n")[1].split(f"<!-- {name}:end -->")[0]


def table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def events_table(heading: str) -> dict[str, list[str]]:
    text = EVENTS_MD.read_text()
    after = text.split(heading)[1].split("\n#")[0]
    body = next(block for block in after.split("\n\n") if block.lstrip().startswith("|"))
    return {ticked(row[0])[0]: row for row in table_rows(body)}


def test_every_event_type_and_its_data_fields_are_documented() -> None:
    rows = events_table("## Events\n")
    assert list(rows) == list(events.EVENT_TYPES)
    for model in typing.get_args(typing.get_args(events.Event)[0]):
        kind = model.model_fields["type"].default
        fields = set(model.model_fields) - {"type"}
        documented = set(ticked(rows[kind][1]))
        assert fields <= documented, f"{kind}: {fields - documented} not in docs/events.md"


def test_every_reason_is_documented_with_its_default_retryable() -> None:
    rows = events_table("### Why a turn failed: `reason`\n")
    assert set(rows) == set(typing.get_args(events.ErrorReason))
    for reason, row in rows.items():
        retryable = row[2]
        if retryable in ("yes", "no"):
            assert (retryable == "yes") == events.RETRYABLE_BY_DEFAULT[reason], reason


def record_fields() -> set[str]:
    """Every field the code writes to a run record."""
    return set(records.RunRecord.model_fields)


def test_every_run_record_field_is_documented_and_no_other() -> None:
    text = EVENTS_MD.read_text()
    documented = {
        name for row in table_rows(section(text, "record-fields")) for name in ticked(row[0])
    }
    assert documented == record_fields()
    for name in STATUS_ONLY_FIELDS:
        assert f"`{name}`" in text


def test_record_options_list_every_run_option() -> None:
    from worker.options.spec import RunOptions

    rows = table_rows(section(EVENTS_MD.read_text(), "record-fields"))
    options = next(row for row in rows if ticked(row[0]) == ["options"])
    assert set(ticked(options[2])) >= set(RunOptions.model_fields)


def exit_codes(text: str) -> list[int]:
    return [int(row[0]) for row in table_rows(section(text, "exit-statuses"))]


@pytest.mark.parametrize("page", ["events.md", "operations.md"])
def test_exit_statuses_in_the_docs_match_harness_help(page: str) -> None:
    in_help = [int(code) for code in re.findall(r"^  ([0-9]+) ", cli.EXIT_STATUSES, re.M)]
    assert exit_codes((ROOT / "docs" / page).read_text()) == in_help


def test_every_stdio_json_message_type_is_documented() -> None:
    source = (ROOT / "adapters" / "stdio_json.py").read_text()
    mapped = set(re.findall(r'kind == "([a-z-]+)"', source))
    assert mapped, "no message types found in adapters/stdio_json.py"
    rows = table_rows(section(EVENTS_MD.read_text(), "stdio-json"))
    documented = {re.search(r'"type":"([a-z-]+)"', row[0]).group(1) for row in rows}  # type: ignore[union-attr]
    assert documented == mapped
    for row in rows:  # each line becomes an event of the set
        assert ticked(row[1])[0] in events.EVENT_TYPES


def settings_in_env_example() -> set[str]:
    """Every setting (the HTTP API's included: one Settings class)."""
    text = (ROOT / "config" / ".env.example").read_text()
    return set(re.findall(r"^#? ?(HARNESS_[A-Z0-9_]+)=", text, re.M))


def test_every_harness_setting_the_docs_name_exists() -> None:
    settings = settings_in_env_example()
    assert settings
    unknown = set()
    for page in PAGES:
        for name in re.findall(r"HARNESS_[A-Z0-9_]*", page.read_text()):
            if name.endswith("_"):  # a family: HARNESS_ALLOWED_*, HARNESS_MAX_*
                known = any(setting.startswith(name) for setting in settings)
            else:
                known = name in settings or name in NOT_SETTINGS
            if not known:
                unknown.add(f"{page.name}: {name}")
    assert sorted(unknown) == []


def test_names_that_are_not_settings_still_exist_where_they_are_said_to() -> None:
    for name, path in NOT_SETTINGS.items():
        assert name in (ROOT / path).read_text(), f"{name} is no longer in {path}"


def tracked_top_level() -> set[str]:
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {path.split("/")[0] for path in files if "/" in path}


PLACEHOLDER = re.compile(r"[<>*{}]|NEW|new_harness|\.\.\.")
"""A path written as a pattern (``adapters/<module>.py``) or for a harness being added."""


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_path_a_doc_names_exists(page: Path) -> None:
    text = page.read_text()
    tops = tracked_top_level()
    missing = []
    for code in ticked(text):
        for word in code.split():
            path = word.strip("()[],;:.'\"").split("::")[0]
            if "/" not in path or path.split("/")[0] not in tops or PLACEHOLDER.search(path):
                continue
            if not (ROOT / path).exists():
                missing.append(path)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")) and not (
            (page.parent / target).resolve().exists()
        ):
            missing.append(target)
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_docs_stand_alone_without_the_design_notes(page: Path) -> None:
    assert "CONTRACT.md" not in page.read_text()
