"""Runs a team can find again: an index of each tenant's runs, newest first, without a scan.

Per tenant (the runs made without one share the tenant ``""``) a sorted set of run ids
scored by creation time (``Keys.run_list``), and one more per harness and per label
(``KEY=VALUE``), written with the run record (:func:`index_run`). A listing walks the most
selective of them newest first and reads the records it meets in batches; a filter the
index does not hold (the status, a second label) is checked on the record. A member whose
record has expired is skipped and removed when met, so the index shrinks as runs expire;
each index key expires too, ``retention_s`` after the newest run written to it, and never
before a run in it: where a run's keys are given their retention (each turn's terminal, the
run's end: ``RunStore.expire``) its indexes are given at least as long (:func:`keep_indexed`),
so a tenant that starts nothing for longer than the retention keeps its living runs listed.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.errors import InvalidInput
from worker.store.keys import Keys

MAX_LIMIT = 500
"""The most runs one page holds."""
MAX_EXAMINED = 5000
"""The most index members one listing reads: past it the page ends early, with a cursor
(a filter on the status alone might otherwise read every run of a tenant)."""
_BATCH = 100


@dataclass(frozen=True)
class RunFilter:
    """What a listing keeps: all given filters hold (labels: every pair)."""

    status: str | None = None
    harness: str | None = None
    labels: Mapping[str, str] | None = None

    def facets(self) -> list[str]:
        """The indexes this filter could walk, most selective first."""
        found = [f"label:{k}={v}" for k, v in sorted((self.labels or {}).items())]
        if self.harness:
            found.append(f"harness:{self.harness}")
        return found

    def keeps(self, record: Mapping[str, Any]) -> bool:
        if self.status and record.get("status") != self.status:
            return False
        if self.harness and record.get("harness") != self.harness:
            return False
        held = record.get("labels") or {}
        return all(held.get(k) == v for k, v in (self.labels or {}).items())


def index_keys(
    keys: Keys, tenant: str | None, harness: str, labels: Mapping[str, str]
) -> list[str]:
    """Every index a run of ``tenant`` with ``harness`` and ``labels`` belongs to."""
    facets = ["", f"harness:{harness}", *(f"label:{k}={v}" for k, v in labels.items())]
    return [keys.run_list(tenant or "", facet) for facet in facets]


def index_run(
    pipe: Any,
    keys: Keys,
    run_id: str,
    *,
    created_at: float,
    tenant: str | None,
    harness: str,
    labels: Mapping[str, str],
    retention_s: int,
) -> None:
    """Queue on ``pipe`` the writes that put a new run in its tenant's indexes."""
    for key in index_keys(keys, tenant, harness, labels):
        pipe.zadd(key, {run_id: created_at})
        pipe.expire(key, retention_s)


def keep_indexed(
    pipe: Any,
    keys: Keys,
    *,
    tenant: str | None,
    harness: str,
    labels: Mapping[str, str],
    seconds: int,
) -> None:
    """Queue on ``pipe`` the writes that keep a run's indexes at least ``seconds`` more (a
    longer life, from a newer run, is kept: ``EXPIRE GT``)."""
    for key in index_keys(keys, tenant, harness, labels):
        pipe.expire(key, seconds, gt=True)


def unindex_run(
    pipe: Any,
    keys: Keys,
    run_id: str,
    tenant: str | None,
    harness: str,
    labels: Mapping[str, str],
) -> None:
    """Queue on ``pipe`` the removal of a run from its indexes (a run never created)."""
    for key in index_keys(keys, tenant, harness, labels):
        pipe.zrem(key, run_id)


def encode_cursor(score: float, run_id: str) -> str:
    return base64.urlsafe_b64encode(f"{score!r}|{run_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        score, _, run_id = text.partition("|")
        top = float(score)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        top = math.nan
    if not math.isfinite(top):  # nan or inf: no cursor of ours, and Redis refuses nan
        raise InvalidInput("invalid cursor: pass back the cursor a listing returned")
    return top, run_id


def list_runs(
    redis: Any,
    keys: Keys,
    decode: Any,
    *,
    tenant: str | None,
    where: RunFilter,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of ``tenant``'s runs that ``where`` keeps, newest first, and the cursor of the
    next page (None at the end). ``decode`` turns a record hash and its long fields' string
    into its typed dict, or None for a hash that is no record."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1 to {MAX_LIMIT}")
    facets = where.facets()
    key = keys.run_list(tenant or "", facets[0] if facets else "")
    top, after_id = (float("inf"), None) if cursor is None else decode_cursor(cursor)
    page: list[dict[str, Any]] = []
    examined = 0
    last: tuple[float, str] | None = None
    while len(page) < limit and examined < MAX_EXAMINED:
        members = _newest(redis, key, top, after_id, _BATCH)
        if not members:
            return page, None
        records = _records(redis, keys, [m for m, _ in members])
        gone = []
        for (run_id, score), raw in zip(members, records, strict=True):
            examined += 1
            last = (score, run_id)
            record = decode(run_id, *raw) if raw[0] else None
            if record is None:
                gone.append(run_id)
            elif where.keeps(record):
                page.append(record)
                if len(page) == limit:
                    break
        if gone:
            redis.zrem(key, *gone)
        assert last is not None
        top, after_id = last
    return page, None if last is None else encode_cursor(*last)


def _newest(
    redis: Any, key: str, top: float, after_id: str | None, count: int
) -> list[tuple[str, float]]:
    """Members at or below score ``top``, newest first, skipping those of score ``top`` down
    to ``after_id`` (already listed: members of one score come in reverse id order)."""
    high = "+inf" if top == float("inf") else repr(top)
    skip = 0
    while True:
        got = redis.zrevrangebyscore(key, high, "-inf", start=0, num=count + skip, withscores=True)
        rows = [(member, float(score)) for member, score in got]
        if after_id is not None:
            rows = [(m, s) for m, s in rows if not (s == top and m >= after_id)]
        if len(got) < count + skip or len(rows) >= count or not got:
            return rows[:count]
        skip += count  # a run of equal scores longer than a batch: read further


def _records(redis: Any, keys: Keys, run_ids: Sequence[str]) -> list[tuple[dict[str, str], str]]:
    """Each run's record hash and its long fields' string (``records.merge`` joins them)."""
    pipe = redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(keys.run(run_id))
        pipe.get(keys.run_long(run_id))
    replies = pipe.execute()
    return list(zip(replies[::2], replies[1::2], strict=True))
