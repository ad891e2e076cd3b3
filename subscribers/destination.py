"""Where webhooks may go (PROTOCOL §6, settled 2026-11-26).

With a credentials file, a push ``url`` whose host is or resolves to an address that is
not on the public internet (loopback, private, link-local and cloud metadata, CGNAT,
unspecified, multicast, reserved) is refused: at configuration (400 ``validation_error``
naming ``push.url``) and again at every connection, after DNS resolution, so a name that
resolved to a public address when it was configured and to ``127.0.0.1`` later (DNS
rebinding) still cannot reach inside. ``--webhook-allow-cidr`` allows ranges (svix-server's
``whitelist_subnets`` is the model). Without a credentials file (a development server)
any destination goes.

The connection check sits under httpx, in the network backend: the host is resolved
once, every address checked, and the connection opened to a checked address, while the
request keeps the URL's name for ``Host`` and TLS (SNI, certificate).

Every spelling of an address counts as the address: ``127.1``, ``2130706433``,
``0x7f000001`` and ``0177.0.0.1`` are what the C resolver makes of them (``inet_aton``),
and an IPv6 address that carries an IPv4 one (``::ffff:127.0.0.1``, NAT64, 6to4) is
judged by the IPv4 address too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from herald.protocol.errors import ValidationError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Names for inside things that need no DNS record here to be dangerous elsewhere.
_INSIDE_NAMES = frozenset({"localhost", "metadata", "instance-data", "metadata.google.internal"})
_INSIDE_SUFFIXES = (".localhost", ".internal")
RESOLVE_TIMEOUT_S = 5.0


class DestinationRefused(httpcore.ConnectError):
    """A connection the destination guard refused (httpx: a ConnectError)."""


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """``--webhook-allow-cidr`` values as networks (ValueError names a bad one)."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an IP network: {entry!r} (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def literal_address(host: str) -> Address | None:
    """The address ``host`` spells, in any spelling the C resolver takes, or None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if not host or not all(c in "0123456789abcdefABCDEFxX." for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _carried(address: Address) -> list[Address]:
    """``address`` and any IPv4 address it carries (mapped, NAT64, 6to4)."""
    found: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        elif address in _NAT64:
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        elif address.sixtofour is not None:
            found.append(address.sixtofour)
    return found


def _inside(address: Address) -> bool:
    return not address.is_global or address.is_multicast


@dataclass(frozen=True, slots=True)
class DestinationGuard:
    """What webhooks may reach. ``enforced`` False (no credentials file): anything."""

    enforced: bool = False
    allowed: tuple[Network, ...] = ()

    def refused(self, address: Address) -> bool:
        """Whether a connection to ``address`` is refused."""
        if not self.enforced:
            return False
        carried = _carried(address)
        if any(a in net for a in carried for net in self.allowed if a.version == net.version):
            return False
        return any(_inside(a) for a in carried)

    def _name_refused(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return name in _INSIDE_NAMES or name.endswith(_INSIDE_SUFFIXES)

    async def check_url(self, url: str) -> None:
        """Raise ValidationError (naming ``push.url``) when ``url`` may not be a webhook's
        destination: its host spells, names or resolves to a refused address."""
        if not self.enforced:
            return
        host = httpx.URL(url).host
        literal = literal_address(host)
        if literal is not None:
            addresses = [literal]
        else:
            addresses = await resolve(host, 443)
            # An inside name is refused unless it resolves, here, to allowed addresses only.
            if self._name_refused(host) and (not addresses or any(map(self.refused, addresses))):
                raise ValidationError(
                    f"push.url: {host!r} names an internal host; webhooks may not reach it"
                )
        for address in addresses:
            if self.refused(address):
                raise ValidationError(
                    f"push.url: {host!r} is or resolves to {address}, an address that is not "
                    "public; webhooks may not reach it (--webhook-allow-cidr allows a range)"
                )


ANYWHERE = DestinationGuard()  # no credentials file: a development server


async def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (empty when it does not resolve)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError, UnicodeError):
        return []
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the guard between resolution and connection."""

    def __init__(self, guard: DestinationGuard, inner: httpcore.AsyncNetworkBackend) -> None:
        self.guard = guard
        self.inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        literal = literal_address(host)
        addresses = [literal] if literal is not None else await resolve(host, port)
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {host!r}")
        refused = [a for a in addresses if self.guard.refused(a)]
        if refused:
            raise DestinationRefused(f"destination not allowed: {host!r} resolves to {refused[0]}")
        last: Exception | None = None
        for address in addresses:  # each checked; the name stays the request's (Host, SNI)
            try:
                return await self.inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        raise DestinationRefused("webhooks do not connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_transport(guard: DestinationGuard, **options: Any) -> httpx.AsyncHTTPTransport:
    """An httpx transport (``options`` as AsyncHTTPTransport's) whose connections pass
    ``guard``. Without enforcement, httpx's own."""
    transport = httpx.AsyncHTTPTransport(**options)
    if guard.enforced:
        pool = transport._pool
        # httpcore reads the backend at each new connection; httpx does not take one.
        pool._network_backend = GuardedBackend(guard, pool._network_backend)
    return transport
