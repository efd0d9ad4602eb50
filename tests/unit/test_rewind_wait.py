"""A turn's wait for a rewind under way (worker/workspace/steps.py): it also tells whether
rewinds wait to be told in the turn's stream, so a turn after none asks Redis nothing more."""

from __future__ import annotations

import threading
import time

import fakeredis
import pytest

from worker.store.keys import Keys
from worker.workspace import steps

KEYS = Keys("rw")
RUN = "r" + "a" * 24


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_no_lock_and_no_rewinds_means_nothing_to_tell(client: fakeredis.FakeRedis) -> None:
    assert steps.wait_for_rewind(client, KEYS, RUN) is False
    assert steps.take_rewinds(client, KEYS, RUN) == []


def test_rewinds_done_since_the_last_turn_are_pending(client: fakeredis.FakeRedis) -> None:
    client.rpush(KEYS.rewinds(RUN), "{}")
    assert steps.wait_for_rewind(client, KEYS, RUN) is True


def test_the_turn_waits_for_the_lock_and_then_sees_the_rewind_it_pushed(
    client: fakeredis.FakeRedis,
) -> None:
    client.set(KEYS.workspace_lock(RUN), "req")

    def rewind() -> None:
        time.sleep(0.3)
        client.rpush(KEYS.rewinds(RUN), "{}")
        client.delete(KEYS.workspace_lock(RUN))

    worker = threading.Thread(target=rewind)
    worker.start()
    started = time.monotonic()
    assert steps.wait_for_rewind(client, KEYS, RUN) is True
    assert time.monotonic() - started >= 0.3
    worker.join()


def test_a_lock_held_past_the_wait_leaves_the_rewinds_to_be_looked_for(
    client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "LOCK_WAIT_S", 0.2)
    client.set(KEYS.workspace_lock(RUN), "req")
    assert steps.wait_for_rewind(client, KEYS, RUN) is True
