"""Where the gateway may connect for a user: the same places the user's sandbox could reach.

With the gateway, the control plane calls `llm_base_url` from the host, so a user could aim it
at the host's own services (Redis, the API, the engine) or at the cloud's metadata service.
The rule mirrors the sandbox fence (docs/security.md): link-local, multicast and unspecified
addresses never; this host's own addresses (loopback, its interfaces, the sandbox networks'
gateways) only on the ports of ACS_SANDBOX_HOST_PORTS (a model server on the host); anything
else (the internet, the LAN) yes. The check is made on the addresses the connection then uses
(an aiohttp resolver), so a name that resolves differently the second time gains nothing.

`host.docker.internal`, which users write for a model server on the host (it is what sandboxes
call the host), means this host: when it does not resolve here, it is the deployment's sandbox
network gateway, an address of this host where such a server listens.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

HOST_ALIAS = "host.docker.internal"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationRefused(Exception):
    """The address is not one the gateway may call for a user."""


_local_cache: dict[str, bool] = {}


def is_local_address(address: IPAddress) -> bool:
    """An address of this host: loopback, or one a socket can bind to (cached)."""
    if address.is_loopback:
        return True
    key = str(address)
    if key not in _local_cache:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((key, 0))
            _local_cache[key] = True
        except OSError:
            _local_cache[key] = False
    return _local_cache[key]


def check_address(raw: str, port: int, host_ports: Iterable[int]) -> None:
    try:
        address = ipaddress.ip_address(raw.split("%", 1)[0])
    except ValueError as exc:
        raise DestinationRefused(f"{raw} is not an IP address") from exc
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local or address.is_multicast or address.is_unspecified:
        raise DestinationRefused(f"{address} is link-local, multicast or unspecified")
    if is_local_address(address) and port not in set(host_ports):
        raise DestinationRefused(
            f"{address}:{port} is this host; only ACS_SANDBOX_HOST_PORTS may be called there"
        )


class GuardedResolver(AbstractResolver):
    """Resolves as usual, then keeps only the addresses the rule allows (refusing the call when
    none is left). aiohttp does not ask a resolver about IP literals: Destinations.prepare
    checks those."""

    def __init__(self, host_ports: Callable[[], Iterable[int]]) -> None:
        self._inner = DefaultResolver()
        self._host_ports = host_ports

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        reasons: list[str] = []
        for item in found:
            try:
                check_address(item["host"], port, self._host_ports())
            except DestinationRefused as exc:
                reasons.append(str(exc))
                continue
            allowed.append(item)
        if not allowed:
            raise DestinationRefused(f"{host}: " + "; ".join(reasons))
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class Destinations:
    """The rule for one control plane: its host ports and how it finds the host's gateway."""

    def __init__(
        self,
        host_ports: Callable[[], Iterable[int]],
        host_gateway: Callable[[], Awaitable[str | None]],
    ) -> None:
        self._host_ports = host_ports
        self._host_gateway = host_gateway
        self.resolver = GuardedResolver(host_ports)
        self._alias: str | None = None
        self._prepared: dict[str, str] = {}

    async def _alias_address(self) -> str | None:
        if self._alias is None:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(HOST_ALIAS, None, type=socket.SOCK_STREAM)
                self._alias = str(infos[0][4][0])
            except OSError:
                self._alias = await self._host_gateway()
        return self._alias

    async def prepare(self, url: str, *, resolve_names: bool = False) -> str:
        """`_prepare`, remembered for URLs whose host is an address (their check cannot change
        while the process runs); names are checked at every connection by the resolver."""
        known = self._prepared.get(url)
        if known is not None:
            return known
        prepared = await self._prepare(url, resolve_names=resolve_names)
        if len(self._prepared) < 10_000 and _is_address(URL(prepared).host or ""):
            self._prepared[url] = prepared
        return prepared

    async def _prepare(self, url: str, *, resolve_names: bool = False) -> str:
        """`url` as the gateway will call it (host.docker.internal replaced when it does not
        resolve here), checked: IP literals always, names too with `resolve_names` (calls the
        translator makes, which do not go through our resolver). Raises DestinationRefused."""
        parsed = URL(url)
        host = parsed.host or ""
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if host.lower() == HOST_ALIAS:
            address = await self._alias_address()
            if address is None:
                raise DestinationRefused(f"{HOST_ALIAS} does not resolve on the control plane")
            parsed = parsed.with_host(address)
            host = address
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if resolve_names:
                try:
                    await asyncio.wait_for(self.resolver.resolve(host, port), 10)
                except (OSError, TimeoutError) as exc:
                    raise DestinationRefused(f"{host} does not resolve: {exc}") from exc
            return str(parsed)
        check_address(host, port, self._host_ports())
        return str(parsed)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
