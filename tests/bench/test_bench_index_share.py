"""Rows 10 and 17 charge runs their share of the run indexes (bench/row10_redis.py
``index_share``): an index none of the runs is in (another row's tenant, a label of other
runs, left in the same deployment) costs them nothing, and an index they share with other
runs costs them their part of it. With real Redis (``MEMORY USAGE``)."""

from __future__ import annotations

import uuid

import pytest
import redis

from bench.row10_redis import index_share, key_json_bytes, key_memory
from worker.store.keys import Keys

pytestmark = [pytest.mark.redis]


def test_runs_pay_only_for_the_indexes_they_are_in(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(f"t{uuid.uuid4().hex[:10]}")
    ours = [f"r{i:024d}" for i in range(10)]
    others = [f"o{i:024d}" for i in range(30)]
    mine, mixed, foreign = (
        keys.run_list("", "harness:demo"),
        keys.run_list("", ""),
        keys.run_list("bench", ""),
    )
    try:
        client.zadd(mine, {run: i for i, run in enumerate(ours)})
        client.zadd(mixed, {run: i for i, run in enumerate(ours + others)})
        client.zadd(foreign, {run: i for i, run in enumerate(others)})
        client.sadd(keys.runs_index(), *ours)

        held, raw = index_share(client, keys, ours)

        expected_held = (
            key_memory(client, [mine, keys.runs_index()]) + key_memory(client, [mixed]) // 4
        )
        expected_raw = (
            key_json_bytes(client, mine)
            + key_json_bytes(client, keys.runs_index())
            + key_json_bytes(client, mixed) // 4
        )
        assert held == pytest.approx(expected_held, abs=2)
        assert raw == pytest.approx(expected_raw, abs=2)
    finally:
        client.delete(mine, mixed, foreign, keys.runs_index())
        client.close()
