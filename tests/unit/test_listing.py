"""Listing runs: a tenant's index, newest first, filters and a cursor, no scan (fakeredis)."""

from __future__ import annotations

import time

import fakeredis
import pytest

from worker.errors import InvalidInput
from worker.options.spec import RunOptions, parse_label
from worker.store.keys import Keys
from worker.store.listing import RunFilter
from worker.store.records import RunStore

KEYS = Keys("t")


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(client: fakeredis.FakeRedis) -> RunStore:
    return RunStore(client, KEYS, retention_s=60)


def _run(n: int) -> str:
    return f"r{n:024x}"


def _create(store: RunStore, n: int, *, tenant: str | None = None, **labels: str) -> str:
    harness = "stdio-json" if n % 2 else "claude-code"
    options = RunOptions(harness=harness, executable="harness-demo" if n % 2 else None)
    store.create(_run(n), options, queue="q", sandbox="local", labels=labels, tenant=tenant)
    return _run(n)


def _ids(page: list[dict[str, object]]) -> list[object]:
    return [r["run_id"] for r in page]


def test_runs_are_listed_newest_first_page_by_page(store: RunStore) -> None:
    made = [_create(store, n) for n in range(1, 8)]
    first, cursor = store.list_runs(limit=3)
    assert _ids(first) == made[::-1][:3]
    second, cursor = store.list_runs(limit=3, cursor=cursor)
    assert _ids(second) == made[::-1][3:6]
    third, cursor = store.list_runs(limit=3, cursor=cursor)
    assert _ids(third) == made[:1] and cursor is None
    full, cursor = store.list_runs(limit=7)
    assert len(full) == 7 and cursor is not None
    assert store.list_runs(limit=7, cursor=cursor) == ([], None)


def test_runs_of_equal_creation_time_are_each_listed_once(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    made = [_create(store, n) for n in range(1, 6)]
    for run_id in made:
        client.zadd(KEYS.run_list(""), {run_id: 100.0})
    seen: list[object] = []
    cursor = None
    while True:
        page, cursor = store.list_runs(limit=2, cursor=cursor)
        seen += _ids(page)
        if cursor is None:
            break
    assert sorted(seen) == sorted(made) and len(seen) == len(made)


def test_filters_by_label_harness_and_status(store: RunStore, client: fakeredis.FakeRedis) -> None:
    a = _create(store, 1, team="blue")
    b = _create(store, 2, team="blue")
    _create(store, 3, team="red")
    client.hset(KEYS.run(b), "status", "idle")
    blue, _ = store.list_runs(where=RunFilter(labels={"team": "blue"}))
    assert _ids(blue) == [b, a]
    stdio, _ = store.list_runs(where=RunFilter(labels={"team": "blue"}, harness="stdio-json"))
    assert _ids(stdio) == [a]
    idle, _ = store.list_runs(where=RunFilter(status="idle"))
    assert _ids(idle) == [b]
    assert blue[0]["labels"] == {"team": "blue"}


def test_a_tenant_lists_only_its_own_runs(store: RunStore) -> None:
    mine = _create(store, 1, tenant="acme")
    _create(store, 2, tenant="other")
    _create(store, 3)
    page, _ = store.list_runs(tenant="acme")
    assert _ids(page) == [mine]
    assert store.get(mine)["tenant"] == "acme"
    untenanted, _ = store.list_runs()
    assert _ids(untenanted) == [_run(3)]


def test_an_expired_run_is_skipped_and_dropped_from_the_index(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    old = _create(store, 1, team="x")
    new = _create(store, 2, team="x")
    client.delete(KEYS.run(old))
    page, _ = store.list_runs()
    assert _ids(page) == [new]
    assert client.zscore(KEYS.run_list(""), old) is None
    assert client.zscore(KEYS.run_list("", "label:team=x"), old) is not None  # met later
    store.list_runs(where=RunFilter(labels={"team": "x"}))
    assert client.zscore(KEYS.run_list("", "label:team=x"), old) is None


def test_index_keys_expire_with_the_retention(store: RunStore, client: fakeredis.FakeRedis) -> None:
    _create(store, 1, team="x")
    for key in (KEYS.run_list(""), KEYS.run_list("", "label:team=x")):
        assert 0 < client.ttl(key) <= 60


def test_a_living_run_outlives_its_indexes_ttl_when_nothing_new_is_written(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    """The tenant starts nothing for longer than the retention: the run's turns ending (each
    terminal gives the run's keys their retention, ``RunStore.expire``) keep it listed."""
    run_id = _create(store, 1, tenant="acme", team="x")
    indexes = [
        KEYS.run_list("acme"),
        KEYS.run_list("acme", "harness:stdio-json"),
        KEYS.run_list("acme", "label:team=x"),
    ]
    for key in indexes:
        client.expire(key, 1)  # the retention since the run was created has nearly passed
    store.expire(run_id, 60)  # a turn of the run ends: its keys live 60 s more
    for key in indexes:
        assert 59 <= client.ttl(key) <= 60, key
    time.sleep(1.2)  # past the index's old expiry
    assert _ids(store.list_runs(tenant="acme")[0]) == [run_id]
    assert _ids(store.list_runs(tenant="acme", where=RunFilter(labels={"team": "x"}))[0]) == [
        run_id
    ]
    # A longer life (a newer run's) is never shortened by an older run's end.
    client.expire(indexes[0], 1000)
    store.expire(run_id, 60)
    assert client.ttl(indexes[0]) > 900


def test_listing_never_scans_the_keyspace(store: RunStore, client: fakeredis.FakeRedis) -> None:
    _create(store, 1)
    calls: list[str] = []
    original = client.execute_command

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(str(args[0]).upper())
        return original(*args, **kwargs)

    client.execute_command = spy  # type: ignore[method-assign]
    store.list_runs(where=RunFilter(status="starting"))
    assert calls and not {"SCAN", "KEYS"} & set(calls)


def test_bad_labels_limits_and_cursors_are_refused(store: RunStore) -> None:
    assert parse_label("team=blue") == ("team", "blue")
    for text in ("team", "-x=1", "k=a b"):
        with pytest.raises(InvalidInput):
            parse_label(text)
    with pytest.raises(InvalidInput, match="cursor"):
        store.list_runs(cursor="!!not-a-cursor")
    with pytest.raises(InvalidInput, match="limit"):
        store.list_runs(limit=0)
