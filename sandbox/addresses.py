"""Which IP addresses a host named by a producer or a tenant may be reached at: one rule, for
every check (a ``--repo`` host, a webhook host, the egress gateway's refusal of private
destinations).

An address is **public** when it is globally routable unicast:

- IPv4: none of :data:`NON_PUBLIC_IPV4` (this network, private, shared, loopback,
  link-local and so the cloud metadata address, IETF protocol assignments, documentation,
  the deprecated 6to4 relay anycast, benchmarking, multicast, reserved, broadcast);
- IPv6 carrying an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-translated
  ``::ffff:0:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, 6to4
  ``2002:AABB:CCDD::``): public when the IPv4 address it carries is, since that is where a
  connection to it ends up;
- other IPv6: inside global unicast ``2000::/3`` and outside :data:`NON_PUBLIC_IPV6`
  (IETF protocol assignments, Teredo among them, documentation). Everything outside
  ``2000::/3`` is refused: loopback, unspecified, unique-local, link-local, site-local
  ``fec0::/10``, multicast, discard, the local-use NAT64 prefix ``64:ff9b:1::/48`` (its
  translators are private by definition) and the reserved rest.

Python's ``ipaddress.is_global`` is not this rule: it lets multicast (``224.0.0.1``,
``ff0e::1``), site-local ``fec0::1`` and the IPv4-compatible, -translated and NAT64 forms of
loopback and metadata through, so it is not used.

A name is checked on the same lookup its connection then uses (:func:`resolve_public`): a
second lookup could answer otherwise (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from sandbox.base import AddressRefused, Unresolvable

__all__ = [
    "AddressRefused",
    "Unresolvable",
    "check_public",
    "describe",
    "embedded_ipv4",
    "is_public",
    "parse",
    "refused_networks",
    "resolve",
    "resolve_public",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NON_PUBLIC_IPV4: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
"""IPv4 networks that are not public (RFC 6890's special-purpose registry, multicast)."""

GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
NON_PUBLIC_IPV6: tuple[str, ...] = ("2001::/23", "2001:db8::/32", "3fff::/20")
"""Inside ``2000::/3`` but not public: IETF protocol assignments (Teredo ``2001::/32``, whose
client address is reached through a relay, among them), documentation."""

EMBEDDING_IPV4: tuple[tuple[str, str], ...] = (
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::ffff:0:0:0/96", "IPv4-translated"),
    ("::/96", "IPv4-compatible"),
    ("64:ff9b::/96", "NAT64"),
)
"""IPv6 prefixes whose low 32 bits are an IPv4 address a connection ends up at."""
SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
"""6to4: bits 16 to 48 are the IPv4 address of the site's relay."""

_V4 = tuple(ipaddress.IPv4Network(n) for n in NON_PUBLIC_IPV4)
_V6 = tuple(ipaddress.IPv6Network(n) for n in NON_PUBLIC_IPV6)
_EMBEDDING = tuple((ipaddress.IPv6Network(n), name) for n, name in EMBEDDING_IPV4)


def parse(text: str) -> IPAddress:
    """An address as ``getaddrinfo`` gives it (an IPv6 zone ``%eth0`` dropped: only
    link-local addresses carry one, and those are refused anyway)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def embedded_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address carries, and the name of the form, or None."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    value = int(address)
    for network, name in _EMBEDDING:
        if address in network:
            return ipaddress.IPv4Address(value & 0xFFFFFFFF), name
    if address in SIX_TO_FOUR:
        return ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF), "6to4"
    return None


def is_public(address: IPAddress | str) -> bool:
    """Whether ``address`` is globally routable unicast (the module's docstring states the
    rule); an IPv6 address carrying an IPv4 one is judged by the IPv4 address."""
    if isinstance(address, str):
        address = parse(address)
    carried = embedded_ipv4(address)
    if carried is not None:
        address = carried[0]
    if isinstance(address, ipaddress.IPv4Address):
        return not any(address in network for network in _V4)
    return address in GLOBAL_UNICAST and not any(address in network for network in _V6)


def describe(address: IPAddress) -> str:
    """``address``, and the IPv4 address it carries if any (for messages)."""
    carried = embedded_ipv4(address)
    return f"{address} ({carried[1]} {carried[0]})" if carried else str(address)


def resolve(host: str, port: int) -> tuple[IPAddress, ...]:
    """Every address of ``host`` (an IP literal is its own), in the resolver's order, without
    repeats; :class:`Unresolvable` if it has none. Blocking."""
    try:
        return (parse(host),)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unresolvable(f"cannot resolve the host {host!r}") from exc
    found: dict[IPAddress, None] = {}
    for info in infos:
        if info[0] in (socket.AF_INET, socket.AF_INET6):
            found[parse(str(info[4][0]))] = None
    if not found:
        raise Unresolvable(f"the host {host!r} has no IP address")
    return tuple(found)


def check_public(host: str, addresses: Iterable[IPAddress]) -> None:
    """:class:`AddressRefused` unless every one of ``host``'s ``addresses`` is public (one
    private answer is enough to refuse: which one a client connects to is not ours to say)."""
    for address in addresses:
        if not is_public(address):
            raise AddressRefused(
                f"the host {host!r} resolves to {describe(address)}, a non-public address"
            )


def resolve_public(host: str, port: int) -> tuple[IPAddress, ...]:
    """``host``'s addresses, every one of them public, from one lookup: connect to these
    (not to the name, whose next lookup may answer otherwise). :class:`AddressRefused`,
    :class:`Unresolvable`. Blocking."""
    addresses = resolve(host, port)
    check_public(host, addresses)
    return addresses


def refused_networks() -> tuple[str, ...]:
    """Every address :func:`is_public` refuses, as networks (CIDR), for a filter that
    takes only networks (the egress gateway's squid): the IPv4 table, the IPv6 space
    outside ``2000::/3`` but for the forms that carry an IPv4 address, the IPv6 table, and
    the image of the IPv4 table in each of those forms."""
    refused: list[IPNetwork] = list(_V4)
    outside: list[ipaddress.IPv6Network] = [ipaddress.IPv6Network("::/0")]
    for keep in (GLOBAL_UNICAST, *(network for network, _ in _EMBEDDING)):
        outside = [part for net in outside for part in _exclude(net, keep)]
    refused += outside
    refused += _V6
    for carrier, _ in _EMBEDDING:
        refused += [_image(carrier, 96, v4) for v4 in _V4]
    refused += [_image(SIX_TO_FOUR, 16, v4) for v4 in _V4]
    v4 = ipaddress.collapse_addresses(n for n in refused if n.version == 4)
    v6 = ipaddress.collapse_addresses(n for n in refused if n.version == 6)
    return tuple(str(n) for n in (*v4, *v6))


def _exclude(
    network: ipaddress.IPv6Network, hole: ipaddress.IPv6Network
) -> list[ipaddress.IPv6Network]:
    if not network.overlaps(hole):
        return [network]
    if hole.supernet_of(network):
        return []
    return list(network.address_exclude(hole))


def _image(
    carrier: ipaddress.IPv6Network, at: int, v4: ipaddress.IPv4Network
) -> ipaddress.IPv6Network:
    """The IPv6 network of ``carrier`` carrying ``v4`` at bit ``at`` (from the left)."""
    shift = 128 - at - 32
    base = int(carrier.network_address) | (int(v4.network_address) << shift)
    return ipaddress.IPv6Network((base, at + v4.prefixlen))
