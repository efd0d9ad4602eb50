"""The per-run credential: a random token the harness can present back to us (for example
to an MCP endpoint), issued fresh for every turn, live only while the run's lease lasts and
revoked at teardown. Redis keeps only its SHA-256, so reading Redis does not yield a token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from worker.store.keys import Keys, SyncRedis

CREDENTIAL_ENV = "HARNESS_RUN_TOKEN"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(client: SyncRedis, keys: Keys, run_id: str, ttl_s: int) -> str:
    """A fresh token for this turn; replaces the run's previous one."""
    token = secrets.token_urlsafe(32)
    client.set(keys.credential(run_id), _digest(token), ex=ttl_s)
    return token


def verify(client: SyncRedis, keys: Keys, run_id: str, token: str) -> bool:
    stored = client.get(keys.credential(run_id))
    return bool(stored) and hmac.compare_digest(str(stored), _digest(token))


def revoke(client: SyncRedis, keys: Keys, run_id: str) -> None:
    client.delete(keys.credential(run_id))


def is_live(client: SyncRedis, keys: Keys, run_id: str) -> bool:
    return bool(client.exists(keys.credential(run_id)))
