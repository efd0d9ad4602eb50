"""The publisher against a real Redis: a script call left running (its reply unread) has
stored its events already, and a script Redis forgot is loaded and its call made again
(a dropped connection: tests/unit/test_publisher.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import cast

import pytest
import redis

from adapters.events import AssistantText
from tests.helpers import wait_for
from worker.store.keys import Keys, SyncRedis
from worker.store.publisher import SCRIPT_BATCH, SCRIPT_MIN, RedisStreamPublisher


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncRedis]:
    real = redis.Redis.from_url(redis_url, decode_responses=True)
    yield cast(SyncRedis, real)
    real.close()


@pytest.fixture
def keys(client: SyncRedis) -> Iterator[Keys]:
    keys = Keys("t" + uuid.uuid4().hex[:10])
    yield keys
    client.delete(keys.events("r1"))


def _texts(count: int, start: int = 0) -> list[AssistantText]:
    return [AssistantText(text=str(i)) for i in range(start, start + count)]


def _stored(client: SyncRedis, keys: Keys) -> list[str]:
    return [json.loads(f["data"])["text"] for _, f in client.xrange(keys.events("r1"))]


def test_events_are_in_the_stream_before_their_reply_is_read(client: SyncRedis, keys: Keys) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    assert publisher.publish(_texts(SCRIPT_BATCH)) is True
    wait_for(lambda: len(_stored(client, keys)) == SCRIPT_BATCH, timeout=5)
    assert publisher.published == 0  # nobody has read the reply yet
    assert publisher.publish(_texts(SCRIPT_MIN, SCRIPT_BATCH)) is True
    assert publisher.flush() is True
    assert publisher.published == SCRIPT_BATCH + SCRIPT_MIN
    assert _stored(client, keys) == [str(i) for i in range(SCRIPT_BATCH + SCRIPT_MIN)]


def test_a_script_redis_forgot_is_loaded_again(client: SyncRedis, keys: Keys) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    publisher.publish(_texts(SCRIPT_MIN))
    assert publisher.flush() is True
    cast(redis.Redis, client).script_flush()  # as a restarted Redis has
    publisher.publish(_texts(SCRIPT_MIN, SCRIPT_MIN))  # EVALSHA answered NOSCRIPT
    assert publisher.flush() is True
    assert _stored(client, keys) == [str(i) for i in range(2 * SCRIPT_MIN)]
