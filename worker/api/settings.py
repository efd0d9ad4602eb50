"""The HTTP API's own settings (``HARNESS_API_*``, ``HARNESS_TENANTS_FILE``,
``HARNESS_WEBHOOK_*``), read beside the worker's :class:`config.Settings`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from config import SettingsError

CommaList = Annotated[tuple[str, ...], NoDecode]


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="HARNESS_", env_file=".env", extra="ignore", frozen=True
    )

    tenants_file: str = ""
    """The tenants and their keys (JSON, or TOML when it ends in ``.toml``); without one
    every request but ``/v1/healthz`` is refused (401)."""
    api_max_body_bytes: int = Field(17 * 1024 * 1024, gt=0)
    """The largest request body (413 above): a turn input up to HARNESS_MAX_INPUT_BYTES and
    its JSON around it."""
    api_rate_limit: int = Field(600, ge=0)
    """Requests per tenant per window (0: no limit); a tenant's own ``rate_limit`` is
    bounded by it."""
    api_rate_window_s: int = Field(60, gt=0)
    api_keepalive_s: float = Field(15.0, gt=0)
    """A comment line on an idle event stream this often (proxies drop silent ones)."""
    api_cors_origins: CommaList = ()
    """Origins a browser may call the API from; none (the default) sends no CORS headers."""
    api_read_batch: int = Field(256, gt=0, le=4096)
    """Run streams one XREAD of the shared stream reader names at most."""
    webhook_schemes: CommaList = ("https",)
    webhook_hosts: CommaList = ("*",)
    """Hosts a webhook may be delivered to: ``*`` is any host whose addresses are all
    public; a loopback, private or metadata address only when named here."""
    webhook_timeout_s: float = Field(10.0, gt=0)
    webhook_retry_for_s: float = Field(24 * 3600.0, gt=0)
    """A delivery no 2xx has answered is retried, with backoff, for this long."""
    webhook_backoff_s: float = Field(1.0, gt=0)
    """The first retry's delay, doubled at each retry up to 10 minutes."""
    webhook_poll_s: float = Field(0.5, gt=0)
    """How often the API looks for new events to deliver and deliveries due."""
    webhook_lease_s: float = Field(60.0, gt=0)
    """A delivery being sent is due again after this if its process never says how it went
    (it died): above HARNESS_WEBHOOK_TIMEOUT_S."""

    @field_validator("api_cors_origins", "webhook_schemes", "webhook_hosts", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


def load_api_settings(**overrides: object) -> ApiSettings:
    try:
        return ApiSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = "HARNESS_" + "_".join(str(p) for p in error["loc"]).upper()
            problems.append(f"{name}: {error['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
