"""Where a run's model requests go, and which of its grants are model credentials.

A run's **upstream** is, in this order: the producer's ``--base-url`` (already held to
``HARNESS_ALLOWED_BASE_URLS`` and the tenant's ``base_urls``), the operator's
``HARNESS_MODEL_UPSTREAMS`` entry for its harness (a company's LLM proxy, a self-hosted model),
else the vendor's API (:data:`VENDOR_UPSTREAMS`). A harness with no upstream at all (a
``stdio-json`` program nobody named one for) has no route.

A **model credential** is a granted variable whose name
:data:`config.harnesses.MODEL_KEYS` (or the operator's ``HARNESS_MODEL_KEYS``) lists: the
harness gets a stand-in under that name and the real value never enters its sandbox
(:mod:`worker.gateway.standins`).

The harness is pointed at ``http://127.0.0.1:PORT`` followed by the upstream's own path, so
that it appends its API's path as it would to the upstream's: the gateway keeps the path and
changes only the origin (:meth:`Upstream.target`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

VENDOR_UPSTREAMS: dict[str, str] = {
    "claude-code": "https://api.anthropic.com",
    "codex": "https://api.openai.com/v1",
    "gemini": "https://generativelanguage.googleapis.com",
    # Through the gateway both speak OpenAI's Chat Completions (our provider config): another
    # vendor is reached through an OpenAI-compatible proxy named in HARNESS_MODEL_UPSTREAMS.
    "opencode": "https://api.openai.com/v1",
    "pi": "https://api.openai.com/v1",
}
"""Each vendor CLI's API, as its base URL setting takes it (codex, opencode and pi append
``/responses`` or ``/chat/completions`` to ``…/v1``; claude-code and gemini add the version)."""


class UpstreamError(ValueError):
    """An upstream URL the gateway cannot use (the operator's setting names it)."""


@dataclass(frozen=True)
class Upstream:
    """One run's upstream: ``origin`` (``https://host:port``) and ``path`` (``/v1``, or empty)."""

    origin: str
    path: str
    source: str
    """``base-url`` (the producer's), ``operator`` (HARNESS_MODEL_UPSTREAMS) or ``vendor``."""

    @classmethod
    def parse(cls, url: str, source: str) -> Upstream:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"{url!r} is not an http(s) URL")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise UpstreamError(f"{url!r}: an upstream has no query, fragment or user")
        origin = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        return cls(origin, parts.path.rstrip("/"), source)

    @property
    def url(self) -> str:
        return self.origin + self.path

    def local(self, port: int) -> str:
        """The base URL the harness is given: the gateway's address, the upstream's path."""
        return f"http://127.0.0.1:{port}{self.path}"

    def target(self, target: str) -> str | None:
        """The upstream URL of a request's target (``/v1/messages?x=1``), or None when the
        target is outside the upstream's path (not the run's upstream)."""
        if not target.startswith("/") or target.startswith("//"):
            return None
        path = target.split("?", 1)[0]
        if self.path and path != self.path and not path.startswith(self.path + "/"):
            return None
        segments = path.split("/")
        if ".." in segments or "." in segments:
            return None
        return self.origin + target


def upstream_for(
    harness: str, base_url: str | None, operator: Mapping[str, tuple[str, ...]]
) -> Upstream | None:
    """The run's upstream (None: the harness has none, and so no route)."""
    if base_url:
        return Upstream.parse(base_url, "base-url")
    named = operator.get(harness) or ()
    if named:
        return Upstream.parse(named[0], "operator")
    vendor = VENDOR_UPSTREAMS.get(harness)
    return Upstream.parse(vendor, "vendor") if vendor else None
