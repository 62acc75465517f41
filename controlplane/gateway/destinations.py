"""Where the gateway may connect for a user: the outbound policy (controlplane/outbound), and
what users write for a model server on this host.

With the gateway, the control plane calls `llm_base_url` from the host, so a user could aim it
at the host's own services, the metadata service, another user's sandbox, the cluster, Redis or
another replica: the policy refuses those (docs/security.md#12-outbound-connections). The direct
path connects through the policy's client (no redirects, each address checked as it is
connected to); the translator gets the policy's rules with each call and holds LiteLLM to them
at its own connections (controlplane/outbound/event_loop.py). `prepare` checks a URL early, so
that a refused one is answered before anything starts.

`host.docker.internal`, which users write for a model server on the host (it is what sandboxes
call the host), means this host: when it does not resolve here, it is the deployment's sandbox
network gateway, an address of this host where such a server listens.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

from yarl import URL

from controlplane.outbound.client import GuardedResolver, OutboundClient
from controlplane.outbound.policy import DestinationRefused
from controlplane.outbound.sources import OutboundSources

HOST_ALIAS = "host.docker.internal"
PREPARED = 10_000
"""URLs whose prepared form is kept (those with an address for a host)."""


class Destinations:
    """The policy of one control plane, the client that holds to it, and its host's alias."""

    def __init__(
        self, sources: OutboundSources, host_gateway: Callable[[], Awaitable[str | None]]
    ) -> None:
        self._sources = sources
        self._host_gateway = host_gateway
        # Answers are read as sent: a provider's compression is refused (`Accept-Encoding:
        # identity`), never inflated (no decompression bomb, no CPU spent on it).
        self.client = OutboundClient(sources.user, limit=0, auto_decompress=False)
        self._resolver = GuardedResolver(sources.user)
        self._alias: str | None = None
        self._prepared: dict[str, str] = {}

    @property
    def rules_json(self) -> str:
        """The policy's rules as the translator takes them (X-Acs-Outbound)."""
        return self._sources.rules_json

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
        """`_prepare`, remembered for URLs whose host is an address (nothing of it can change
        but the rules, and every connection is checked again as it is made)."""
        known = self._prepared.get(url)
        if known is not None:
            return known
        prepared = await self._prepare(url, resolve_names=resolve_names)
        if len(self._prepared) < PREPARED and _is_address(URL(prepared).host or ""):
            self._prepared[url] = prepared
        return prepared

    async def _prepare(self, url: str, *, resolve_names: bool = False) -> str:
        """`url` as the gateway will call it (host.docker.internal replaced when it does not
        resolve here), checked: an address always, a name too with `resolve_names` (calls the
        translator makes: refused here, they are answered before it starts). Raises
        DestinationRefused."""
        parsed = URL(url)
        host = parsed.host or ""
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if host.lower() == HOST_ALIAS:
            address = await self._alias_address()
            if address is None:
                raise DestinationRefused(f"{HOST_ALIAS} does not resolve on the control plane")
            parsed = parsed.with_host(address)
            host = address
        if _is_address(host):
            self._sources.user.check(host, port)
        elif resolve_names:
            try:
                await asyncio.wait_for(self._resolver.resolve(host, port), 10)
            except DestinationRefused:
                raise
            except (OSError, TimeoutError) as exc:
                raise DestinationRefused(f"{host} does not resolve: {exc}") from exc
        return str(parsed)

    async def close(self) -> None:
        await self.client.close()
        await self._resolver.close()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
