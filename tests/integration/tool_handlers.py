"""A producer's tool set for the integration tests, served by ``harness tools serve orders
tests.integration.tool_handlers:HANDLERS`` in its own process."""

from __future__ import annotations

import os
import time
from pathlib import Path


def lookup(order_id: int) -> dict[str, object]:
    """Look up an order by its id."""
    return {"id": order_id, "status": "shipped"}


def fail(why: str) -> str:
    """Always raises."""
    raise ValueError(f"cannot: {why}")


def which(tag: str, seconds: float = 0.0) -> str:
    """Which server process answered, after ``seconds``."""
    time.sleep(seconds)
    return f"{tag} answered by {os.getpid()}"


def slow(mark: str, seconds: float) -> str:
    """Marks that it started (a file), then takes ``seconds``."""
    Path(mark).write_text(str(os.getpid()))
    time.sleep(seconds)
    return f"slow done by {os.getpid()}"


HANDLERS = [lookup, fail, which, slow]
