"""The exceptions producers see. Every client method raises these, never Redis or Celery's.

HarnessError
├── InvalidInput      the request is malformed or beyond operator policy (CLI exit 2)
│   └── BudgetSpent   the run's budget is spent: raise it (``harness budget``) first
├── InvalidSettings   a setting is missing or invalid (a HARNESS_REDIS_URL that is not a Redis
│                     URL); the message names the variable; also a config.SettingsError (exit 2)
├── RunNotFound       no such run (CLI exit 1)
│   ├── GroupNotFound no such group of attempts (or another tenant's)
│   └── StreamLost    the run's record is gone while its stream has no end: Redis lost it
│                     (restarted without persistence, flushed, evicted) or it expired; a
│                     follower stops with it instead of waiting for events that cannot come
├── RunBusy           a turn of this run is still in flight (CLI exit 2)
├── RunEnded          the run has ended or failed; it takes no more turns (CLI exit 2)
├── Refused           the run's host refused or failed a diff, export or rewind (no such
│                     snapshot, over a ceiling, the run busy); the message says why (exit 1)
├── RequestNotFound   no such permission request in the run (CLI exit 1)
├── AnswerRefused     a permission request already answered, expired or closed, or a group
│                     whose other attempt was picked already (CLI exit 2)
├── Unavailable       Redis or the broker cannot be reached (CLI exit 1); also raised while
│                     iterating ``events()``, whose caller may resume after the last id seen
└── TurnWaitTimeout   ``wait()`` or ``follow(wait=...)`` gave up before the turn ended or
                      started (also a TimeoutError; CLI ``--wait``: exit 124)
"""

from __future__ import annotations

from config import SettingsError


class HarnessError(Exception):
    exit_code = 1


class InvalidInput(HarnessError, ValueError):
    exit_code = 2


class BudgetSpent(InvalidInput):
    """The run's next turn would be refused: a limit of its budget is reached."""


class InvalidSettings(HarnessError, SettingsError):
    exit_code = 2


class RunNotFound(HarnessError, LookupError):
    exit_code = 1

    def __init__(self, run_id: str) -> None:
        super().__init__(f"unknown run {run_id!r}")
        self.run_id = run_id


class GroupNotFound(RunNotFound):
    def __init__(self, group: str) -> None:
        HarnessError.__init__(self, f"unknown group {group!r}")
        self.run_id = group


class StreamLost(RunNotFound):
    """The followed run is gone from Redis: its record is missing and its stream does not end
    with a terminal event (worker/store/stream_end.py), so no more of its events will come.
    A Redis restarted without persistence, flushed or evicting keys loses runs this way
    (docs/operations.md, "Running in production"); so does a run whose retention ran out."""

    exit_code = 1

    def __init__(self, run_id: str) -> None:
        HarnessError.__init__(
            self,
            f"run {run_id} is lost: its record is gone from Redis and its stream has no end "
            "(Redis lost its data: restarted without persistence, flushed or evicting; or "
            "the run expired); no more events will come",
        )
        self.run_id = run_id


class RunBusy(HarnessError):
    exit_code = 2

    def __init__(self, run_id: str, turn: int | None = None) -> None:
        what = f"turn {turn}" if turn else "a turn"
        super().__init__(f"run {run_id} is busy: {what} is still in flight (cancel it or wait)")
        self.run_id = run_id


class RunEnded(HarnessError):
    exit_code = 2

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} is {status}; it takes no more turns")
        self.run_id = run_id
        self.status = status


class Refused(HarnessError):
    exit_code = 1


class RequestNotFound(HarnessError, LookupError):
    exit_code = 1


class AnswerRefused(HarnessError):
    """The permission request was answered already (the first answer wins), its deadline
    passed or its turn ended; the message says which and how it was decided."""

    exit_code = 2


class Unavailable(HarnessError):
    exit_code = 1


class TurnWaitTimeout(HarnessError, TimeoutError):
    """A bounded wait ran out. The turn itself goes on (it stays queued or running)."""

    exit_code = 124  # as timeout(1) exits when its command ran out of time

    def __init__(self, run_id: str, turn: int, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.turn = turn
