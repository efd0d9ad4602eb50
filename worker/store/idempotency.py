"""Idempotency keys: a retried ``start_run`` or ``submit_turn`` that names the key its first
try named (the API's ``Idempotency-Key`` header, ``harness run/turn --idempotency-key``)
gets the first try's answer and starts nothing new (docs/api.md, "Idempotency").

One Redis string per key, in its tenant's keys (``TENANT:idempotency:SHA256``, the tenant
``""`` for a caller without one): no tenant's key ever finds another's answer. The first
request claims it with ``SET NX`` (its fingerprint and ``pending``), does its work, then
stores the answer there for ``HARNESS_IDEMPOTENCY_TTL_S``. A request that finds the key
taken: another fingerprint (another body, route or run) is :class:`IdempotencyMismatch`;
an answer is returned as it is; ``pending`` is waited for up to :data:`WAIT_S`, then
:class:`IdempotencyInProgress`. Work that fails releases the claim (nothing was started,
so a retry tries again); a claimer that dies mid-work leaves it for :data:`CLAIM_S`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from worker.errors import HarnessError, InvalidInput
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis

T = TypeVar("T")

KEY = re.compile(r"^[A-Za-z0-9._:~+/=-]{1,255}$")
"""An idempotency key: 1 to 255 of letters, digits and ``. _ : ~ + / = -`` (a UUID, a ULID,
base64)."""
KEY_RULE = "1 to 255 letters, digits or . _ : ~ + / = -"
CLAIM_S = 120
"""How long a claim whose claimer died holds its key (then a retry starts afresh)."""
WAIT_S = 5.0
"""How long a duplicate waits for the first request's answer before 409 ``in_progress``."""
POLL_S = 0.05

# Only the claim's own holder releases it or writes its answer (a claim that ran past
# CLAIM_S may be someone else's by then).
_IF_HELD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""


class IdempotencyMismatch(InvalidInput):
    """The key was used with another request within its retention window."""


class IdempotencyInProgress(HarnessError):
    """The key's first request is still at work; try again after ``retry_after_s``."""

    retry_after_s = 1


def check_key(key: object) -> str:
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise InvalidInput(f"invalid idempotency key: {KEY_RULE}")
    return key


def file_digest(path: str | Path) -> str:
    """``NAME:SHA256`` of a file a request carries (its temporary path is no part of it);
    the path as it is when it cannot be read (the work itself then refuses it)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1024 * 1024), b""):
                digest.update(block)
    except OSError:
        return str(path)
    return f"{Path(path).name}:{digest.hexdigest()}"


def fingerprint(operation: str, **fields: Any) -> str:
    """What a retry must repeat: the operation and its fields, as canonical JSON, hashed."""
    text = json.dumps(
        {"operation": operation, **fields}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


class Idempotency:
    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        ttl_s: int,
        *,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.clock = clock
        self.sleep = sleep
        self._if_held = client.register_script(_IF_HELD)

    def name(self, tenant: str | None, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.keys.tenant_key(tenant or "", f"idempotency:{digest}")

    def once(self, tenant: str | None, key: str, print_: str, work: Callable[[], T]) -> T:
        """``work()``'s answer (JSON: a run id, a turn number), the first time ``key`` is
        used by ``tenant``; that same answer for as long as the key is kept."""
        name = self.name(tenant, check_key(key))
        claim = json.dumps(
            {"fingerprint": print_, "state": "pending", "claim": secrets.token_hex(8)}
        )
        deadline = self.clock() + self.wait_s
        while not self.client.set(name, claim, nx=True, ex=CLAIM_S):
            found = self.client.get(name)
            if found is None:
                continue  # released or expired between the two calls: claim it again
            record = json.loads(found)
            if record.get("fingerprint") != print_:
                raise IdempotencyMismatch(
                    f"idempotency key {key!r} was used for another request (another body, "
                    f"route or run) in the last {self.ttl_s}s: a new request needs a new key"
                )
            if record.get("state") == "done":
                answer: T = record["answer"]
                return answer
            if self.clock() >= deadline:
                raise IdempotencyInProgress(
                    f"the first request with idempotency key {key!r} is still in progress; "
                    f"retry after {IdempotencyInProgress.retry_after_s}s"
                )
            self.sleep(POLL_S)
        try:
            answer = work()
        except BaseException:
            with contextlib.suppress(*REDIS_ERRORS):  # else the claim lapses after CLAIM_S
                self._if_held(keys=[name], args=[claim, "", 0])
            raise
        done = json.dumps({"fingerprint": print_, "state": "done", "answer": answer})
        self._if_held(keys=[name], args=[claim, done, self.ttl_s])
        return answer
