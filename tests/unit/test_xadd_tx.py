"""Big events as a guarded transaction (worker/store/xadd_tx.py): what its replies vouch for.
Against a real Redis: tests/integration/test_stream_publish.py."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from worker.store import xadd_tx

HEAD = ["OK", 1, "OK", "QUEUED", "QUEUED"]


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        ([*HEAD, ["1-1", "1-2"]], (2, 0)),
        ([b"OK", 1, b"OK", b"QUEUED", b"QUEUED", [b"1-1", b"1-2"]], (2, 0)),
        ([*HEAD, [None, None]], (2, 2)),  # NOMKSTREAM: the stream is gone
        ([*HEAD, None], None),  # aborted: the guard found an entry in the way, or a write
        (["OK", 0, "OK", "QUEUED", "QUEUED", None], None),
        ([*HEAD, ResponseError("EXECABORT")], None),
        (["OK", ResponseError("BUSY"), "OK", "QUEUED", "QUEUED", ["1-1", "1-2"]], None),
        (["OK", 1, ResponseError("BUSY"), "1-1", "1-2", ResponseError("no MULTI")], None),
        ([*HEAD, ["1-1", ResponseError("refused")]], None),
        ([*HEAD, ["1-1", None]], None),
        ([*HEAD, ["1-1"]], None),
    ],
)
def test_only_a_whole_batch_stored_or_dropped_is_vouched_for(
    replies: list[object], expected: tuple[int, int] | None
) -> None:
    assert xadd_tx.outcome(replies, 2) == expected


def test_only_the_runs_first_event_may_make_the_stream() -> None:
    entries = [("1-0", "turn-started", "{}", "0"), ("1-1", "assistant-text", "{}", "0")]
    commands = xadd_tx.commands("s", 100, entries)
    assert [c[0] for c in commands] == ["WATCH", "EVAL", "MULTI", "XADD", "XADD", "EXEC"]
    assert "NOMKSTREAM" not in commands[3] and "NOMKSTREAM" in commands[4]
    assert commands[0] == ("WATCH", "s", xadd_tx.fence_key("s"))
    assert commands[1][2:] == (2, "s", xadd_tx.fence_key("s"), "1-0")
