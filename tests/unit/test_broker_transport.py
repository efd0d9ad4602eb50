"""Which kombu transport a producer's app uses (worker/broker.py): ours for a Redis broker,
the URL's own for any other, named by the app itself so a producer's process keeps kombu's
aliases for its own Celery apps; the worker's app names none (its banner shows the URL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from worker import broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", broker.TRANSPORT),
        ("rediss://example.invalid:6380/1", broker.TRANSPORT),
        ("REDIS://127.0.0.1", broker.TRANSPORT),
        ("amqp://guest:guest@127.0.0.1:5672//", None),
        ("pyamqp://127.0.0.1//", None),
    ],
)
def test_an_app_names_our_transport_only_for_a_redis_broker(url: str, expected: str | None) -> None:
    assert broker.transport_for(url) == expected


def test_a_producers_app_publishes_through_one_redis_client_and_leaves_the_aliases() -> None:
    probe = (
        "import kombu.transport\n"
        "before = dict(kombu.transport.TRANSPORT_ALIASES)\n"
        "from config import load_settings\n"
        "from worker.app import create_app, create_producer_app\n"
        "app = create_producer_app(load_settings(broker_url='redis://127.0.0.1:1/0'))\n"
        "conn = app.connection_for_write()\n"
        "print(type(conn.transport).__module__, before == kombu.transport.TRANSPORT_ALIASES)\n"
        "other = create_producer_app(load_settings(broker_url='amqp://guest:guest@127.0.0.1:1//'))\n"
        "print(type(other.connection_for_write().transport).__module__)\n"
        "worker = create_app(load_settings(broker_url='rediss://:pw@127.0.0.1:1/0'))\n"
        "print(worker.connection_for_write().as_uri())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    ours, other, banner = done.stdout.splitlines()
    assert ours == "worker.broker True"
    assert other.startswith("kombu.transport.")
    assert banner == "rediss://:**@127.0.0.1:1/0"
