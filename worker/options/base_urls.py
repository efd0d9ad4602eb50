"""Which base URLs a producer may point a harness at (``--base-url``, ``base_url``).

A harness sends its model credential (a granted API key) to its base URL, whatever the
network: the operator's policy (``HARNESS_ALLOWED_BASE_URLS``) and a tenant's (its
``base_urls``) bound it, with the one matcher here (:func:`base_url_allowed`). An entry is:

- ``*``: any base URL;
- a host: ``llm.internal``, ``10.0.0.5``, ``[fd00::5]``, or ``*.example.com`` (its
  subdomains, not itself), over http or https on any port;
- a host and port: ``llm.internal:8443``, over http or https;
- a URL prefix: ``https://llm.internal:8443/v1``: that scheme, host and port (the scheme's
  own when none is written), and a path under that one (whole segments).

URLs are compared after parsing, never as text, and only URLs every client reads the same way
pass: a host that is a DNS name or an IP literal, nothing else in the authority (no
``user@``, which makes ``http://allowed.com@evil.com`` a request to evil.com), no backslash
(Node reads ``http://evil.com\\@allowed.com`` as evil.com), no percent-escape or dot segment
(``/v1/../admin``), no host that a URL parser would read as a number (``2130706433`` is
127.0.0.1 to Node).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class PolicyEntryError(ValueError):
    """An entry of a base URL policy is not one (the policy's fault, not the producer's)."""


@dataclass(frozen=True)
class BaseUrl:
    """A base URL as a harness's client reads it."""

    scheme: str
    host: str
    """Lower case, without a trailing dot; an IPv6 literal without brackets."""
    port: int
    path: str
    """Without a trailing slash: ``""`` for the root."""


@dataclass(frozen=True)
class Allowance:
    """One entry of a base URL policy (see the module docstring); ``host`` None: any."""

    host: str | None
    subdomains: bool = False
    scheme: str | None = None
    port: int | None = None
    path: str = ""

    def admits(self, url: BaseUrl) -> bool:
        if self.host is None:
            return True
        if self.scheme is not None and url.scheme != self.scheme:
            return False
        if self.subdomains:
            if _is_ip(url.host) or not url.host.endswith("." + self.host):
                return False
        elif url.host != self.host:
            return False
        if self.port is not None and url.port != self.port:
            return False
        return not self.path or url.path == self.path or url.path.startswith(self.path + "/")


def parse_base_url(url: str) -> BaseUrl:
    """A producer's base URL; ``ValueError`` saying why it cannot be compared safely."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise ValueError("expected http(s)://host[:port][/path]")
    if any(c in "\\%" or not 0x20 < ord(c) < 0x7F for c in url):
        raise ValueError(
            "a backslash, a percent-escape, a space, a control or a non-ASCII character"
        )
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    host, port = _authority(authority, scheme, wildcard=False)
    path = re.split(r"[?#]", tail, maxsplit=1)[0]
    return BaseUrl(scheme, host, port if port is not None else _DEFAULT_PORTS[scheme], _path(path))


def parse_allowance(text: str) -> Allowance:
    """One policy entry; ``ValueError`` saying what is wrong with it."""
    entry = text.strip()
    if entry == "*":
        return Allowance(None)
    if "://" in entry:
        url_scheme, _, rest = entry.partition("://")
        scheme = url_scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError("a URL prefix is http:// or https://")
        authority, slash, path = rest.partition("/")
        host, port = _authority(authority, scheme, wildcard=True)
        port = port if port is not None else _DEFAULT_PORTS[scheme]
        return _allowance(host, scheme, port, _path(slash + path))
    host, port = _authority(entry, None, wildcard=True)
    return _allowance(host, None, port, "")


def _allowance(host: str, scheme: str | None, port: int | None, path: str) -> Allowance:
    if host.startswith("*."):
        return Allowance(host[2:], True, scheme, port, path)
    return Allowance(host, False, scheme, port, path)


def base_url_allowed(url: str, entries: Iterable[str]) -> bool:
    """Whether ``url`` is admitted by one of ``entries``. ``ValueError`` when the URL cannot
    be compared safely (:func:`parse_base_url`) or an entry is not one
    (:func:`parse_allowance`, naming it)."""
    allowances = []
    for entry in entries:
        try:
            allowances.append(parse_allowance(entry))
        except ValueError as exc:
            raise PolicyEntryError(f"entry {entry.strip()[:80]!r}: {exc}") from None
    if any(a.host is None for a in allowances):
        return True
    parsed = parse_base_url(url)
    return any(a.admits(parsed) for a in allowances)


def _authority(text: str, scheme: str | None, *, wildcard: bool) -> tuple[str, int | None]:
    if not text or any(c in text for c in "@%\\"):
        raise ValueError("the authority must be a plain host[:port] (no user@, no escapes)")
    if text.startswith("["):
        literal, _, tail = text[1:].partition("]")
        try:
            host = str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise ValueError(f"{literal[:60]!r} is not an IPv6 address") from None
        if tail and not tail.startswith(":"):
            raise ValueError("expected [ipv6]:port")
        port_text = tail[1:] if tail else None
    else:
        host, sep, port_text_or = text.rpartition(":")
        if not sep:
            host, port_text_or = text, ""
        port_text = port_text_or if sep else None
        host = host.lower()
        host = host[:-1] if host.endswith(".") else host
        bare = host[2:] if wildcard and host.startswith("*.") else host
        if not _is_ipv4(bare) and (
            not _HOST_NAME.fullmatch(bare) or _NUMERIC_LABEL.fullmatch(bare.rsplit(".", 1)[-1])
        ):
            raise ValueError(f"{host[:60]!r} is not a host name or an IP address")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port {port_text[:10]!r} is not 1-65535")
    return host, int(port_text)


def _path(path: str) -> str:
    segments = path.split("/")
    if any(s in (".", "..") for s in segments):
        raise ValueError("a dot segment ('.' or '..') in the path")
    return path.rstrip("/")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
