"""Attempts side by side (``harness run --attempts N``, ``harness attempts``, ``harness pick``):
N runs started from one seed and one input at once, under one group, each in its own
sandbox, compared, and one picked (docs/events.md, "Forks and attempts").

A group is a hash in Redis (``Keys.group``): its runs in attempt order, its tenant, the
attempt picked. Each attempt is an ordinary run (its own budget, key slots, record: ``group``
and ``attempt``, and the label ``group=G`` that ``list_runs`` finds them by); spreading over
harnesses or models gives attempt ``i`` the ``i``-th of each list, round robin.
"""

from __future__ import annotations

import difflib
import json
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from config import Settings
from worker.client.reading import StreamEvent
from worker.client.workspace import WorkspaceRequests
from worker.errors import AnswerRefused, GroupNotFound, InvalidInput
from worker.options.policy import grants_for
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RunStore

GROUP_ID_PREFIX = "g"
MAX_ATTEMPTS = 16
DIFF_MAX_FILE_BYTES = 1_000_000
"""A file bigger than this is compared by size and digest only in a diff of two attempts."""

CreateRun = Callable[..., str]
ReadEvents = Callable[[str], Iterator[StreamEvent]]
EndRun = Callable[[str], Any]


def check_group_id(group: object) -> str:
    if not (
        isinstance(group, str)
        and len(group) == 25
        and group.startswith(GROUP_ID_PREFIX)
        and all(c in "0123456789abcdef" for c in group[1:])
    ):
        raise InvalidInput(f"invalid group id {str(group)[:40]!r}: expected 'g' and 24 hex digits")
    return group


def spread(value: str | list[str] | tuple[str, ...] | None, count: int) -> list[str | None]:
    """``a,b`` (or a list) spread over ``count`` attempts, round robin; None stays None."""
    if value is None:
        return [None] * count
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [item.strip() for item in items if isinstance(item, str) and item.strip()]
    if not items:
        raise InvalidInput("an empty list of harnesses or models")
    return [items[i % len(items)] for i in range(count)]


def per_harness_grants(harnesses: list[str], grants: object, settings: Settings) -> dict[str, Any]:
    """The grants each harness of a group gets: all of them for a group of one harness (a
    refused one is refused as for a run), else those the operator allows each harness, so
    that ``--grant ANTHROPIC_API_KEY --grant OPENAI_API_KEY`` over claude-code and codex
    gives each CLI its own key. A grant no harness of the group may take is refused."""
    names = set(harnesses)
    if grants is None or len(names) == 1:
        return dict.fromkeys(names, grants)
    if not isinstance(grants, list | tuple) or not all(isinstance(g, str) for g in grants):
        raise InvalidInput("invalid request: grants: expected a list of strings")
    given = {name: grants_for(name, grants, settings) for name in names}
    unused = set(grants) - {g for kept in given.values() for g in kept}
    if unused:
        raise InvalidInput(
            f"grant {sorted(unused)[0]!r} is allowed for none of {', '.join(sorted(given))} "
            "(operator policy HARNESS_GRANTS)"
        )
    return dict(given)


class Attempts:
    """Groups of attempts, for :class:`worker.client.harness.HarnessClient`."""

    def __init__(
        self,
        settings: Settings,
        client: SyncRedis,
        keys: Keys,
        store: RunStore,
        workspace: WorkspaceRequests,
        create_run: CreateRun,
        read_events: ReadEvents,
        end_run: EndRun,
        retention_s: int,
    ) -> None:
        self.settings = settings
        self.client, self.keys, self.store, self.workspace = client, keys, store, workspace
        self._create, self._events, self._end = create_run, read_events, end_run
        self.retention_s = retention_s

    def start(
        self,
        harness: str | list[str],
        input: str,
        *,
        attempts: int,
        model: str | list[str] | None = None,
        labels: dict[str, str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Start ``attempts`` runs of ``input`` at once; ``{"group", "runs"}``. ``harness``
        and ``model`` may be lists (or ``a,b``) spread over the attempts. Each is refused as
        :meth:`HarnessClient.start_run` refuses a run; a refusal after some attempts started
        ends them (nothing half-made is left)."""
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise InvalidInput("attempts: expected a whole number")
        if not 1 <= attempts <= MAX_ATTEMPTS:
            raise InvalidInput(f"attempts: 1 to {MAX_ATTEMPTS}, not {attempts}")
        harnesses, models = spread(harness, attempts), spread(model, attempts)
        names = [name or "" for name in harnesses]
        grants = per_harness_grants(names, options.pop("grants", None), self.settings)
        group = GROUP_ID_PREFIX + secrets.token_hex(12)
        key = self.keys.group(group)
        self.client.hset(
            key,
            mapping={
                "runs": "[]",
                "tenant": options.get("tenant") or "",
                "created_at": str(time.time()),
                "attempts": str(attempts),
            },
        )
        self.client.expire(key, self.retention_s)
        runs: list[str] = []
        try:
            for number, (name, chosen) in enumerate(zip(names, models, strict=True), 1):
                run_id = self._create(
                    name,
                    input,
                    model=chosen,
                    grants=grants.get(name),
                    labels={**(labels or {}), "group": group},
                    lineage={"group": group, "attempt": number},
                    **options,
                )
                runs.append(run_id)
                self.client.hset(key, mapping={"runs": json.dumps(runs)})
        except Exception:
            for run_id in runs:
                self._end(run_id)
            self.client.delete(key)
            raise
        return {"group": group, "runs": runs}

    def group(self, group: str, tenant: str | None = None) -> dict[str, Any]:
        """The group's hash, typed: GroupNotFound when unknown or another tenant's."""
        check_group_id(group)
        raw = self.client.hgetall(self.keys.group(group))
        if not raw or (raw.get("tenant") or None) != tenant:
            raise GroupNotFound(group)
        picked = raw.get("picked")
        return {
            "group": group,
            "runs": json.loads(raw.get("runs") or "[]"),
            "picked": int(picked) if picked else None,
            "created_at": float(raw.get("created_at") or 0),
        }

    def compare(self, group: str, tenant: str | None = None) -> dict[str, Any]:
        """Every attempt side by side: ``{"group", "picked", "attempts": [{"index",
        "run_id", "harness", "model", "status", "outcome", "structured", "answer", "diff":
        {"files", "lines_added", "lines_removed"}, "input_tokens", "output_tokens",
        "cost_usd", "wall_s"}]}``."""
        found = self.group(group, tenant)
        rows = [self._row(index, run_id) for index, run_id in enumerate(found["runs"], 1)]
        return {"group": group, "picked": found["picked"], "attempts": rows}

    def _row(self, index: int, run_id: str) -> dict[str, Any]:
        record = self.store.find(run_id)
        if record is None:
            return {"index": index, "run_id": run_id, "status": "gone"}
        files: set[str] = set()
        added = removed = 0
        terminal: StreamEvent | None = None
        for event in self._events(run_id):
            if event.type == "workspace":
                for kind in ("added", "modified", "deleted"):
                    files.update(p for p in event.data.get(kind) or [] if isinstance(p, str))
                added += int(event.data.get("lines_added") or 0)
                removed += int(event.data.get("lines_removed") or 0)
            elif event.type in ("turn-complete", "session-error"):
                terminal = event
        return {
            "index": index,
            "run_id": run_id,
            "harness": record.harness,
            "model": record.model_reported or record.model_requested,
            "status": record.status,
            "turns": record.turns,
            "outcome": _outcome(terminal),
            "answer": terminal.data.get("text")
            if terminal and terminal.type == "turn-complete"
            else None,
            "structured": terminal.data.get("structured") if terminal else None,
            "diff": {"files": len(files), "lines_added": added, "lines_removed": removed},
            "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens,
            "cost_usd": record.cost_usd,
            "wall_s": round(record.wall_s, 3),
        }

    def diff(self, group: str, a: int, b: int, tenant: str | None = None) -> str:
        """A unified diff from attempt ``a``'s workspace to attempt ``b``'s, as they stand
        after each one's last turn (exported from their hosts)."""
        runs = self.group(group, tenant)["runs"]
        for n in (a, b):
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(runs):
                raise InvalidInput(f"attempt {n!r}: the group has attempts 1 to {len(runs)}")
        with tempfile.TemporaryDirectory(prefix="harness-attempts-") as folder:
            trees = []
            for n in (a, b):
                archive = Path(folder) / f"{n}.tar.gz"
                self.workspace.export(runs[n - 1], archive)
                trees.append(_files(archive))
        return _unified(trees[0], trees[1], f"attempt-{a}", f"attempt-{b}")

    def pick(
        self,
        group: str,
        attempt: int,
        *,
        tenant: str | None = None,
        export_to: str | Path | None = None,
    ) -> dict[str, Any]:
        """Pick attempt ``attempt``: the others are ended, the picked one goes on as a normal
        run (its next turn, its branch as ``--push-branch`` pushed it, its export to
        ``export_to``). The first pick wins: picking another one later is refused
        (AnswerRefused); picking the same again ends whatever still runs and answers the
        same."""
        found = self.group(group, tenant)
        runs = found["runs"]
        if (
            isinstance(attempt, bool)
            or not isinstance(attempt, int)
            or not 1 <= attempt <= len(runs)
        ):
            raise InvalidInput(f"attempt {attempt!r}: the group has attempts 1 to {len(runs)}")
        key = self.keys.group(group)
        if not self.client.execute_command("HSETNX", key, "picked", str(attempt)):
            picked = int(self.client.execute_command("HGET", key, "picked") or 0)
            if picked != attempt:
                raise AnswerRefused(f"group {group}: attempt {picked} was picked already")
        chosen = runs[attempt - 1]
        ended = [run_id for n, run_id in enumerate(runs, 1) if n != attempt]
        for run_id in ended:
            self._end(run_id)
        answer: dict[str, Any] = {
            "group": group,
            "picked": attempt,
            "run_id": chosen,
            "ended": ended,
        }
        if export_to is not None:
            answer["export"] = self.workspace.export(chosen, export_to)
        record = self.store.find(chosen)
        if record is not None and record.options is not None and record.options.push_branch:
            answer["branch"] = record.options.push_branch
        return answer


def _outcome(terminal: StreamEvent | None) -> str:
    if terminal is None:
        return "in-progress"
    if terminal.type == "turn-complete":
        return "complete"
    return str(terminal.data.get("reason") or "failed")


def _files(archive: Path) -> dict[str, bytes]:
    """The regular files of one of our exports, by path (read from the archive, never
    unpacked: nothing of it reaches the disk)."""
    found: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name.removeprefix("./")
            if member.size > DIFF_MAX_FILE_BYTES:
                found[name] = f"<{member.size} bytes: too big to compare>\n".encode()
                continue
            handle = tar.extractfile(member)
            found[name] = handle.read() if handle is not None else b""
    return found


def _unified(left: dict[str, bytes], right: dict[str, bytes], a: str, b: str) -> str:
    out: list[str] = []
    for name in sorted(set(left) | set(right)):
        before, after = left.get(name), right.get(name)
        if before == after:
            continue
        old = _lines(before)
        new = _lines(after)
        if old is None or new is None:
            out.append(f"Binary files {a}/{name} and {b}/{name} differ\n")
            continue
        out.extend(
            difflib.unified_diff(
                old,
                new,
                fromfile=f"{a}/{name}" if before is not None else "/dev/null",
                tofile=f"{b}/{name}" if after is not None else "/dev/null",
            )
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def _lines(data: bytes | None) -> list[str] | None:
    if data is None:
        return []
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None
