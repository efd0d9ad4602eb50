"""Tenants of the HTTP API: ``HARNESS_TENANTS_FILE``, their keys and their policy.

The file (JSON, or TOML when its name ends in ``.toml``) maps a tenant name to its API keys
(only their SHA-256: a key is printed once, by ``harness tenant add`` or ``rotate``), whether
it is revoked, its webhook secret and URL, its request rate and its policy. A
:class:`TenantRegistry` reads the file again whenever it changes on disk, so a revoked key
stops working at the next request, without a restart.

A tenant's policy only narrows the operator's (:func:`apply_policy` runs before the
client's own policy check, which still applies in full): harnesses, images, grants,
networks, base URLs, tool sets and MCP servers it may ask for, ceilings on each run's budget,
and how many of a limited key's concurrency slots (``HARNESS_KEY_SLOTS``) its runs hold at once
(``key_slots``: the run carries it, the slot script counts the tenant's holders).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from config import Settings, SettingsError
from worker.errors import InvalidInput
from worker.options.base_urls import parse_allowance
from worker.options.policy import check_base_url
from worker.options.spec import ENV_NAME
from worker.options.tenant_names import TENANT_NAME

KEY_PREFIX = "hk_"
BUDGET_LIMITS = ("max_cost_usd", "max_tokens", "max_turns", "max_wall_s")


class TenantPolicy(BaseModel):
    """What a tenant may ask for; None: whatever the operator allows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    harnesses: tuple[str, ...] | None = None
    images: tuple[str, ...] | None = None
    grants: tuple[str, ...] | None = None
    networks: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    mcp: tuple[str, ...] | None = None
    base_urls: tuple[str, ...] | None = None
    """Base URLs its runs may name (entries as HARNESS_ALLOWED_BASE_URLS', which still
    bounds them)."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    max_turns: int | None = Field(default=None, gt=0)
    max_wall_s: float | None = Field(default=None, gt=0)
    fallback_models: dict[str, tuple[str, ...]] | None = None
    """Per harness, the models the model gateway asks in turn when the model fails, for a run
    of the tenant's that names none (``--fallback-model``); before the operator's."""
    key_slots: dict[str, int] | None = None
    """Per limited grant, the most of its key's slots the tenant's runs hold at once (the
    operator's HARNESS_KEY_SLOTS limit still bounds it)."""

    @field_validator("base_urls")
    @classmethod
    def _base_urls(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for entry in value or ():
            parse_allowance(entry)
        return value

    @field_validator("key_slots")
    @classmethod
    def _key_slots(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for grant, most in (value or {}).items():
            if not ENV_NAME.fullmatch(grant) or most < 1:
                raise ValueError(f"key_slots {grant}={most}: a grant name and at least 1 slot")
        return value


class TenantKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: float = 0.0


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=TENANT_NAME.pattern)
    keys: tuple[TenantKey, ...] = ()
    revoked: bool = False
    webhook_secret: str = ""
    """``whsec_`` and the base64 of the bytes that sign the tenant's webhooks."""
    webhook_url: str | None = None
    """Where the tenant's runs deliver when a run names none."""
    rate_limit: int | None = Field(default=None, ge=0)
    """Requests per window; the operator's HARNESS_API_RATE_LIMIT bounds it."""
    policy: TenantPolicy = TenantPolicy()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def read_tenants(path: Path) -> dict[str, Tenant]:
    """The tenants of a file; SettingsError naming the file when it is not a valid one."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text or "{}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SettingsError(f"HARNESS_TENANTS_FILE {path}: cannot read it: {exc}") from None
    raw = data.get("tenants", {}) if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise SettingsError(f"HARNESS_TENANTS_FILE {path}: expected a 'tenants' table")
    try:
        return {name: Tenant(name=name, **body) for name, body in raw.items()}
    except (ValidationError, TypeError) as exc:
        raise SettingsError(f"HARNESS_TENANTS_FILE {path}: {exc}") from None


def write_tenants(path: Path, tenants: Mapping[str, Tenant]) -> None:
    """Write the file atomically, readable by its owner only (it holds webhook secrets)."""
    body = {
        "tenants": {
            name: tenant.model_dump(mode="json", exclude={"name"}, exclude_none=True)
            for name, tenant in sorted(tenants.items())
        }
    }
    text = _toml(body) if path.suffix == ".toml" else json.dumps(body, indent=2) + "\n"
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)


def _toml(table: Mapping[str, Any], path: str = "") -> str:
    """The subset of TOML a tenants file needs: scalars, lists of scalars, tables and arrays
    of tables."""
    lines: list[str] = []
    nested: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list[Mapping[str, Any]]]] = []
    for key, value in table.items():
        name = f"{path}.{_toml_key(key)}" if path else _toml_key(key)
        if isinstance(value, dict):
            nested.append((name, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            arrays.append((name, value))
        else:
            lines.append(f"{_toml_key(key)} = {json.dumps(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for name, sub in nested:
        out += f"\n[{name}]\n" + _toml(sub, name)
    for name, items in arrays:
        for item in items:
            out += f"\n[[{name}]]\n" + _toml(item, name)
    return out


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


@dataclass
class _Loaded:
    stamp: tuple[int, int, int] | None
    by_hash: dict[str, Tenant]
    tenants: dict[str, Tenant]


class TenantRegistry:
    """The tenants of ``HARNESS_TENANTS_FILE``, read again when the file changes.

    A file that becomes invalid keeps the last valid tenants (a half-edited file must not
    open or close the API); an absent file has no tenants.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._loaded = _Loaded(None, {}, {})
        if self.path is not None:
            self._reload(force=True)

    def _stamp(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def _reload(self, force: bool = False) -> None:
        if self.path is None:
            return
        stamp = self._stamp()
        if not force and stamp == self._loaded.stamp:
            return
        with self._lock:
            try:
                tenants = read_tenants(self.path)
            except SettingsError:
                if force:
                    raise
                return
            by_hash = {
                key.sha256: tenant
                for tenant in tenants.values()
                if not tenant.revoked
                for key in tenant.keys
            }
            self._loaded = _Loaded(stamp, by_hash, tenants)

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant whose live key this is, or None."""
        self._reload()
        digest = hash_key(key)
        for known, tenant in self._loaded.by_hash.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None

    def get(self, name: str) -> Tenant | None:
        self._reload()
        return self._loaded.tenants.get(name)


def _refuse(what: str, tenant: Tenant) -> InvalidInput:
    return InvalidInput(f"{what} is not allowed for tenant {tenant.name} (its policy)")


def _within(value: str, allowed: tuple[str, ...] | None) -> bool:
    return allowed is None or "*" in allowed or value in allowed


def _check_places(
    tenant: Tenant, harness: str, options: dict[str, Any], settings: Settings
) -> None:
    """What the run would run and reach: its harness (and its outcome's grader's), image,
    network, grants, tools, servers and base URL, each within the tenant's policy."""
    policy = tenant.policy
    if not _within(harness, policy.harnesses):
        raise _refuse(f"harness {harness!r}", tenant)
    grader = options.get("grader")
    if grader is not None and not (isinstance(grader, str) and _within(grader, policy.harnesses)):
        raise _refuse(f"grader harness {grader!r}", tenant)
    image = options.get("image") or settings.image_for(harness)
    if policy.images is not None and not (image and _within(image, policy.images)):
        raise _refuse(f"image {image!r}", tenant)
    network = options.get("network") or settings.network
    if not _within(network, policy.networks):
        raise _refuse(f"network {network!r}", tenant)
    for field, allowed in (("grants", policy.grants), ("tools", policy.tools), ("mcp", policy.mcp)):
        for name in options.get(field) or ():
            if not isinstance(name, str) or not _within(name, allowed):
                raise _refuse(f"{field} {name!r}", tenant)
    base_url = options.get("base_url")
    if policy.base_urls is not None and isinstance(base_url, str):
        check_base_url(base_url, policy.base_urls, f"tenant {tenant.name}'s policy base_urls")


def apply_policy(
    tenant: Tenant, harness: str, options: dict[str, Any], settings: Settings
) -> dict[str, Any]:
    """``options`` (those of ``start_run``) checked against the tenant's policy, with its
    budget ceilings filled in where the run names no budget. InvalidInput names the rule."""
    policy = tenant.policy
    _check_places(tenant, harness, options, settings)
    result = dict(options)
    fallback = (policy.fallback_models or {}).get(harness)
    if fallback and not options.get("fallback_models"):
        result["fallback_models"] = list(fallback)
    if policy.key_slots:
        granted = set(options.get("grants") or ())
        caps = {grant: most for grant, most in policy.key_slots.items() if grant in granted}
        if caps:
            result["key_slots"] = caps
    for name in BUDGET_LIMITS:
        ceiling = getattr(policy, name)
        if ceiling is None:
            continue
        asked = result.get(name)
        if asked is None:
            result[name] = ceiling
        elif isinstance(asked, int | float) and asked > ceiling:
            raise InvalidInput(
                f"{name} {asked:g} exceeds tenant {tenant.name}'s ceiling of {ceiling:g}"
            )
    return result


def check_budget(tenant: Tenant, limits: Mapping[str, float | int | None]) -> None:
    """A budget change within the tenant's ceilings (0, no limit, is above any)."""
    for name, value in limits.items():
        ceiling = getattr(tenant.policy, name, None) if name in BUDGET_LIMITS else None
        if ceiling is None or value is None:
            continue
        if value == 0 or value > ceiling:
            shown = "no limit" if value == 0 else f"{value:g}"
            raise InvalidInput(
                f"{name} {shown} exceeds tenant {tenant.name}'s ceiling of {ceiling:g}"
            )


def add_tenant(path: Path, name: str, **fields: Any) -> tuple[Tenant, str]:
    """A new tenant with one key; returns it and the key (never stored)."""
    if not TENANT_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid tenant name {name!r}: 1 to 63 lower-case letters, digits, '_' or '-'"
        )
    tenants = read_tenants(path)
    if name in tenants:
        raise InvalidInput(f"tenant {name!r} exists (rotate its key instead)")
    key = new_key()
    try:
        tenant = Tenant(
            name=name,
            keys=(_key_entry(key),),
            webhook_secret=new_webhook_secret(),
            **fields,
        )
    except ValidationError as exc:
        raise InvalidInput(f"invalid tenant: {exc}") from None
    write_tenants(path, {**tenants, name: tenant})
    return tenant, key


def _key_entry(key: str) -> TenantKey:
    return TenantKey(id=hash_key(key)[:12], sha256=hash_key(key), created_at=time.time())


def _existing(tenants: Mapping[str, Tenant], name: str) -> Tenant:
    if name not in tenants:
        raise InvalidInput(f"no tenant {name!r}")
    return tenants[name]


def revoke(path: Path, name: str, key_id: str | None = None) -> Tenant:
    """Revoke a tenant (every key) or one of its keys (by its id)."""
    tenants = read_tenants(path)
    tenant = _existing(tenants, name)
    if key_id is None:
        changed = tenant.model_copy(update={"revoked": True})
    else:
        kept = tuple(k for k in tenant.keys if k.id != key_id)
        if len(kept) == len(tenant.keys):
            raise InvalidInput(f"tenant {name!r} has no key {key_id!r}")
        changed = tenant.model_copy(update={"keys": kept})
    write_tenants(path, {**tenants, name: changed})
    return changed


def rotate(path: Path, name: str, *, keep_old: bool = False) -> tuple[Tenant, str]:
    """A new key for the tenant (revived if revoked); its other keys stop working unless
    ``keep_old`` (to hand the new key out before the old one stops)."""
    tenants = read_tenants(path)
    tenant = _existing(tenants, name)
    key = new_key()
    kept = tenant.keys if keep_old else ()
    changed = tenant.model_copy(update={"keys": (*kept, _key_entry(key)), "revoked": False})
    write_tenants(path, {**tenants, name: changed})
    return changed, key
