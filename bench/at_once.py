"""Calls released together, as a platform's API submits its users' turns concurrently."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def submit_at_once(submits: list[Callable[[], object]]) -> tuple[float, float]:
    """Run every submit on a thread of its own, released together: (perf_counter at the
    release, seconds until the last submit returned)."""
    gate = threading.Barrier(len(submits) + 1)
    errors: list[BaseException] = []

    def one(submit: Callable[[], object]) -> None:
        gate.wait()
        try:
            submit()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in submits]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return started, time.perf_counter() - started
