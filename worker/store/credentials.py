"""The per-run credential: a random token the harness can present back to us (for example
to an MCP endpoint), issued fresh for every turn, live only while the run's lease lasts and
revoked at teardown. Redis keeps only its SHA-256, so reading Redis does not yield a token.

A credential is bound to the turn it was issued for: the end of a turn revokes only its own
credential or an older one (:func:`revoke` with ``through``), never the token of a turn
begun after it. A lost-turn close that runs late (a redelivered copy of an old turn, a
reaper racing a renewal) cannot cut a live turn off its tools.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from worker.store import lua
from worker.store.keys import Keys, SyncRedis

CREDENTIAL_ENV = "HARNESS_RUN_TOKEN"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(client: SyncRedis, keys: Keys, run_id: str, ttl_s: int, *, turn: int = 0) -> str:
    """A fresh token for ``turn``; replaces the run's previous one."""
    token = secrets.token_urlsafe(32)
    client.set(keys.credential(run_id), f"{turn} {_digest(token)}", ex=ttl_s)
    return token


def verify(client: SyncRedis, keys: Keys, run_id: str, token: str) -> bool:
    stored = client.get(keys.credential(run_id))
    if not stored:
        return False
    digest = str(stored).rpartition(" ")[2]
    return hmac.compare_digest(digest, _digest(token))


def revoke(client: SyncRedis, keys: Keys, run_id: str, *, through: int | None = None) -> bool:
    """Revoke the run's credential: whatever turn it is for (the run's end), or only one
    issued for turn ``through`` or an earlier turn (a turn's end). True when one was."""
    if through is None:
        return bool(client.delete(keys.credential(run_id)))
    return lua.scripts(client).revoke_credential(keys.credential(run_id), through)
