"""Publishing a turn's events to the run's Redis stream, in order, never twice, never lost.

Entry ids are ``{turn}-{seq}``. Events are sent in batches, one round trip per chunk of
harness output: one event as a plain XADD, more as one script call per 1,000
(worker/store/lua.py's xadd_batch.lua, which stops at the first refused id). While Redis is
unreachable they wait in memory and are sent, in order, once it is back. A retried batch is
harmless: Redis refuses an id it already has, and that refusal counts as delivered only when
the stored entry is exactly the one sent. Any other refusal means the turn's stream went on
without this writer (another ended the turn): what is left is dropped, counted in
:attr:`RedisStreamPublisher.dropped` and logged, never published after that turn's terminal.

Only the run's first event (``1-0``) creates its stream. A stream that is gone later went with
its run (Redis lost its data, or the run expired: worker/store/stream_end.py, "lost"), and an
event written there would make a stream of its own that nothing ends or expires: every event
for it is dropped the same way (``NOMKSTREAM``; ``xadd_batch.lua``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable

import redis

from adapters.events import Event
from worker.observe import metrics
from worker.observe.masking import Masker
from worker.store import xadd_tx
from worker.store.errors import REDIS_ERRORS
from worker.store.event_ids import FIRST_ID
from worker.store.keys import Keys, SyncRedis
from worker.store.lua import SentCall, scripts
from worker.store.xadd_tx import SentTransaction

log = logging.getLogger(__name__)

SCRIPT_BATCH = 1000
"""Events per script call: Redis runs a call whole, and 1,000 XADDs take it about 3 ms."""
SCRIPT_MIN = 2
"""Fewer events than this go as a plain XADD: a script call costs Redis ~5-10 us of its own,
which a single event would pay alone (docs/performance.md, row 10). Two or more go as one
script call, never as pipelined XADDs: a pipeline goes on past a refused XADD, so when another
writer had put the turn's terminal at the first id (the run's end, a reaper's ``worker-lost``),
the second and later events would be stored after that terminal."""
LEAVE_RUNNING_MIN = 16
"""A batch of at least this many events leaves its last script call running while the worker
reads the harness's next output (a smaller one is read back at once, as cheap as waiting)."""
LEAVE_RUNNING_BYTES = 64 * 1024
"""... and so does a batch of fewer, bigger events holding at least this much data (coalesced
text: Redis copies it as long as it would run many small events)."""
_DUPLICATE_ID = "equal or smaller than the target stream top item"


class RedisStreamPublisher:
    """Publishes one turn's events with ids ``{turn}-{seq}``."""

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        run_id: str,
        turn: int,
        *,
        maxlen: int,
        masker: Masker | None = None,
        start_seq: int = 0,
        retry_interval_s: float = 0.25,
    ) -> None:
        self._redis = client
        self._key = keys.events(run_id)
        self.turn = turn
        self.seq = start_seq
        self._maxlen = maxlen
        self._masker = masker or Masker()
        self._scripts = scripts(client)
        self._pending: deque[tuple[str, str, str, str]] = deque()
        """(entry id, type, data, ts) of every event not yet stored."""
        self._sent: tuple[SentCall | SentTransaction, int] | None = None
        """The script call left running (:meth:`publish`) and how many pending entries it holds."""
        self._retry_interval = retry_interval_s
        self._next_try = 0.0
        self.published = 0
        self.dropped = 0
        self.superseded = False
        """The turn's stream went on without this writer (another ended the turn): whatever
        is published from then on is dropped."""
        self.retries = 0

    @property
    def key(self) -> str:
        """The run's stream."""
        return self._key

    @property
    def masker(self) -> Masker:
        return self._masker

    @property
    def pending(self) -> int:
        return len(self._pending)

    def publish(self, events: Iterable[Event]) -> bool:
        """Queue the events and send what is pending; False when some wait for a retry (Redis
        is unreachable). A big batch's last script call is left running in Redis, its reply
        read at the next publish or flush: the worker parses the harness's next output
        meanwhile. Its events are in the stream once Redis has run it, reply read or not."""
        ts = f"{time.time():.6f}"
        masker = self._masker if self._masker else None
        pending, turn, seq = self._pending, self.turn, self.seq
        for event in events:
            data = event.data_json()
            if masker is not None:
                data = masker.mask(data)
            pending.append((f"{turn}-{seq}", event.type, data, ts))
            seq += 1
        self.seq = seq
        if self.superseded:  # the turn was ended without us: later events go after its terminal
            self.dropped += len(pending)
            pending.clear()
            return True
        return self._send(leave_last=True)

    def flush(self, *, force: bool = False) -> bool:
        """Send everything pending and wait for it. True when nothing is left."""
        return self._send(force=force)

    def _send(self, *, force: bool = False, leave_last: bool = False) -> bool:
        if not self._pending:
            return True
        now = time.monotonic()
        if not force and now < self._next_try:
            return False
        try:
            if self._sent is not None:
                self._settle()
            if self._pending:
                self._send_pending(leave_last)
        except REDIS_ERRORS as exc:
            self._retry_later(now)
            if self.retries == 1 or self.retries % 20 == 0:
                log.warning(
                    "stream.publish_retry",
                    extra={"stream": self._key, "pending": len(self._pending), "error": str(exc)},
                )
            return False
        return len(self._pending) == (self._sent[1] if self._sent else 0)

    def _retry_later(self, now: float) -> None:
        self.retries += 1
        metrics.publish_retried()
        self._next_try = now + self._retry_interval

    def _settle(self) -> None:
        """Read the reply of the call left running; its entries are the first pending."""
        assert self._sent is not None
        call, size = self._sent
        self._sent = None  # a failed reply leaves its entries pending: they are sent again
        handled, dropped = call.reply()
        if dropped:  # the stream went on without us: nothing pending is published any more
            handled, dropped = len(self._pending), dropped + len(self._pending) - size
        self._done(list(itertools.islice(self._pending, handled)), handled, dropped)

    def _send_pending(self, leave_last: bool) -> None:
        """Send what is pending. ``leave_last``: the last script call is left running
        (:attr:`_sent`)."""
        batch = list(self._pending)
        if len(batch) < SCRIPT_MIN:
            self._done(batch, 1, self._xadd_one(batch[0]))
            return
        # One script call per chunk of the batch (xadd_batch.lua): redis-py packed and parsed
        # one XADD per event, most of our cost per event. The chunk bounds how long Redis is
        # busy with one call (~3 ms).
        leave_last = leave_last and (
            len(batch) >= LEAVE_RUNNING_MIN
            or sum(len(data) for _, _, data, _ in batch) >= LEAVE_RUNNING_BYTES
        )
        for at in range(0, len(batch), SCRIPT_BATCH):
            chunk = batch[at : at + SCRIPT_BATCH]
            sent = self._sent_chunk(chunk)
            if leave_last and at + SCRIPT_BATCH >= len(batch):
                self._sent = (sent, len(chunk))
                return
            handled, dropped = sent.reply()
            if dropped:
                rest = len(batch) - at
                self._done(batch[at:], rest, dropped + rest - len(chunk))
                return
            self._done(chunk, handled, 0)

    def _sent_chunk(self, chunk: list[tuple[str, str, str, str]]) -> SentCall | SentTransaction:
        """One chunk sent to Redis, its reply read later: as one script call, or, when its
        entries are big (coalesced text), as plain XADDs in a guarded transaction, which
        spares Redis handing their data to Lua (worker/store/xadd_tx.py)."""
        key, maxlen = self._key, self._maxlen
        if sum(len(data) for _, _, data, _ in chunk) < xadd_tx.MIN_ENTRY_BYTES * len(chunk):
            return self._scripts.send_xadd_batch(key, maxlen, chunk)
        pool = self._redis.connection_pool
        return xadd_tx.send(
            pool, key, maxlen, chunk, lambda: self._scripts.xadd_batch(key, maxlen, chunk)
        )

    def _xadd_one(self, entry: tuple[str, str, str, str]) -> int:
        """One event as a plain XADD; 1 when it was dropped (the turn's stream went on without
        us, or is gone), 0 when stored (now, or by an earlier try whose reply was lost)."""
        entry_id, kind, data, ts = entry
        try:
            fields = {"type": kind, "data": data, "ts": ts}
            stored: str | None = self._redis.xadd(  # None: NOMKSTREAM found no stream
                self._key,
                fields,
                id=entry_id,
                maxlen=self._maxlen,
                nomkstream=entry_id != FIRST_ID,
            )
            if stored is None:
                log.warning("stream.gone", extra={"stream": self._key, "turn": self.turn})
                return 1
        except REDIS_ERRORS:
            raise
        except redis.ResponseError as exc:
            if _DUPLICATE_ID not in str(exc):
                raise
            return 0 if self._stored_as_sent(entry) else 1
        return 0

    def _stored_as_sent(self, entry: tuple[str, str, str, str]) -> bool:
        """Whether the stream holds exactly this entry (an earlier try stored it)."""
        entry_id, kind, data, _ = entry
        found = self._redis.xrange(self._key, min=entry_id, max=entry_id)
        if len(found) != 1:
            return False
        fields = found[0][1]
        return bool(fields.get("type") == kind and fields.get("data") == data)

    def _done(self, batch: list[tuple[str, str, str, str]], handled: int, dropped: int) -> None:
        for _ in range(handled):
            self._pending.popleft()
        stored = handled - dropped
        self.published += stored
        metrics.events_published(kind for _, kind, _, _ in batch[:stored])
        if dropped:
            self.dropped += dropped
            self.superseded = True
            log.warning(
                "stream.superseded",
                extra={"stream": self._key, "turn": self.turn, "dropped": dropped},
            )

    def drain(self, timeout_s: float) -> bool:
        """Keep trying until everything pending is sent or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while not self.flush(force=True):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._retry_interval)
        return True


def last_seq(client: SyncRedis, keys: Keys, run_id: str, turn: int) -> tuple[int, str | None]:
    """The next free seq of a turn, and the type of its last event (None if it has none)."""
    entries = client.xrevrange(
        keys.events(run_id), max=f"{turn}-18446744073709551615", min=f"{turn}-0", count=1
    )
    if not entries:
        return 0, None
    entry_id, fields = entries[0]
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    kind = fields.get("type") if isinstance(fields, dict) else None
    return int(str(entry_id).split("-")[1]) + 1, kind
