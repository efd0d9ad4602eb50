"""Run page links: a short-lived token that opens one run's page (worker/api/pages/) and
nothing else, so that the page never needs (nor shows) the tenant's API key.

``POST /v1/runs/{id}/links`` makes one: an opaque random token ``hl_LINKID_SECRET`` whose
SHA-256 is kept in Redis (``Keys.page_link``) with its run, tenant, the id of the key that
made it, its mode and its expiry, the key expiring with it. The token is a bearer for the
page's own calls of that run alone (:data:`ROUTES`): its record, events, event stream,
pending requests and diff; with mode ``approve`` also the answer to a permission request and
a message to the run (the page's steer box).
It names its run by where it is kept, so it finds nothing under another run's id. It dies
when it expires, when it is deleted (``DELETE /v1/runs/{id}/links/{link_id}``), when its
tenant is revoked and when the key that made it is revoked or rotated away (the tenants
file); an open stream with it ends at its next check.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.api.errors import ApiError
from worker.api.tenants import Tenant, TenantRegistry, hash_key
from worker.options.spec import RUN_ID
from worker.store.keys import Keys

TOKEN_PREFIX = "hl_"
_TOKEN = re.compile(r"hl_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
LINK_ID = re.compile(r"lnk_[0-9a-f]{16}")
GROUP_ID = re.compile(r"g[0-9a-f]{24}")
DEFAULT_TTL_S = 900
RECHECK_S = 1.0
"""An open stream with a link asks Redis this often whether the link still lives."""

Mode = Literal["read", "approve"]
_READ = frozenset(
    {
        ("GET", "/v1/runs/{run_id}"),
        ("GET", "/v1/runs/{run_id}/events"),
        ("GET", "/v1/runs/{run_id}/events/stream"),
        ("GET", "/v1/runs/{run_id}/permissions"),
        ("GET", "/v1/runs/{run_id}/diff"),
        ("GET", "/v1/groups/{group}"),
    }
)
ROUTES: dict[str, frozenset[tuple[str, str]]] = {
    "read": _READ,
    "approve": _READ
    | {
        ("POST", "/v1/runs/{run_id}/permissions/{request_id}"),
        ("POST", "/v1/runs/{run_id}/messages"),
    },
}
"""What a link of each mode may call (method, route), of its own run."""


class LinkCreate(BaseModel):
    """``POST /v1/runs/{id}/links``."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = "read"
    """``read``: the run live, its requests and diff; ``approve``: also answer its
    permission requests and send it messages."""
    ttl_s: int = Field(DEFAULT_TTL_S, gt=0)
    """Seconds the link lives, at most HARNESS_API_LINK_MAX_TTL_S."""


class LinkCreated(BaseModel):
    link_id: str
    run_id: str
    mode: Mode
    expires_at: float
    """Unix time."""
    path: str
    """The page's path and the token (in the fragment: it never reaches a server's log)."""
    url: str
    """``path`` on the base URL this request came to."""


@dataclass(frozen=True)
class Link:
    link_id: str
    run_id: str
    tenant: str
    key_id: str
    mode: Mode
    expires_at: float


def is_token(credential: str) -> bool:
    return credential.startswith(TOKEN_PREFIX)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id(tenant: Tenant, key: str) -> str:
    """The id of ``tenant``'s key ``key`` (which authenticated the request)."""
    digest = hash_key(key)
    return next((k.id for k in tenant.keys if hmac.compare_digest(k.sha256, digest)), "")


async def create(
    redis: Any, keys: Keys, run_id: str, tenant: Tenant, made_with: str, body: LinkCreate
) -> tuple[Link, str]:
    """A new link to ``run_id`` and its token (said once: only its hash is kept)."""
    hex_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    link = Link(
        f"lnk_{hex_id}", run_id, tenant.name, made_with, body.mode, time.time() + body.ttl_s
    )
    name = keys.page_link(run_id, link.link_id)
    pipe = redis.pipeline(transaction=True)
    pipe.hset(
        name,
        mapping={
            "sha256": _digest(secret),
            "tenant": link.tenant,
            "key_id": link.key_id,
            "mode": link.mode,
            "expires_at": repr(link.expires_at),
        },
    )
    pipe.expire(name, body.ttl_s)
    await pipe.execute()
    return link, f"{TOKEN_PREFIX}{hex_id}_{secret}"


async def find(redis: Any, keys: Keys, run_id: str, token: str) -> Link | None:
    """The live link of ``run_id`` that ``token`` is, or None (another run's, expired,
    deleted, not a token)."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return None
    link_id = f"lnk_{match[1]}"
    fields = await redis.hgetall(keys.page_link(run_id, link_id))
    if not fields or not hmac.compare_digest(fields.get("sha256", ""), _digest(match[2])):
        return None
    link = Link(
        link_id,
        run_id,
        fields["tenant"],
        fields["key_id"],
        "approve" if fields["mode"] == "approve" else "read",
        float(fields["expires_at"]),
    )
    return link if link.expires_at > time.time() else None


def holder(link: Link, tenants: TenantRegistry) -> Tenant | None:
    """The link's tenant while it and the key that made the link are live, else None."""
    tenant = tenants.get(link.tenant)
    if tenant is None or tenant.revoked or not any(k.id == link.key_id for k in tenant.keys):
        return None
    return tenant


async def authenticate(
    api: Any, token: str, method: str, route: str, run_id: str | None, group: str | None = None
) -> tuple[Tenant, Link] | None:
    """The tenant a request bearing the link ``token`` acts as, and the link; None when no
    live link of this run has it; 403 for a call the link's mode does not allow. A route of
    a group of attempts (no run id) is the link's when its run is one of the group's."""
    if run_id is None and group is not None:
        run_id = await _run_of_group(api, token, group)
    if run_id is None or not RUN_ID.fullmatch(run_id):
        return None
    link = await find(api.pool, api.keys, run_id, token)
    tenant = holder(link, api.tenants) if link is not None else None
    if link is None or tenant is None:
        return None
    if (method, route) not in ROUTES[link.mode]:
        raise ApiError(403, "forbidden", f"a {link.mode} page link cannot call {method} {route}")
    return tenant, link


async def _run_of_group(api: Any, token: str, group: str) -> str | None:
    """The run of ``group`` whose live link ``token`` is, if any."""
    if not GROUP_ID.fullmatch(group):
        return None
    runs = json.loads(await api.pool.hget(api.keys.group(group), "runs") or "[]")
    for run_id in runs:
        if not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            continue
        if await find(api.pool, api.keys, run_id, token) is not None:
            return run_id
    return None


async def revoke(redis: Any, keys: Keys, run_id: str, link_id: str) -> bool:
    """Delete the link; False when there was none (or it had expired)."""
    if not LINK_ID.fullmatch(link_id):
        return False
    return bool(await redis.delete(keys.page_link(run_id, link_id)))
