"""aiohttp held to an outbound policy: the one way the control plane's own process opens a
connection for someone else (the LLM gateway's direct calls, lifecycle webhooks).

- A name is resolved by `GuardedResolver`, which keeps only the addresses the policy allows;
  aiohttp connects to those very addresses (nothing resolves the name a second time), so a name
  whose answer changes between a check and a connection gains nothing.
- aiohttp never asks a resolver about an IP literal; the socket factory checks every address
  just before its socket is made, literal or resolved, so no connection escapes the check.
- Redirects are never followed (`OutboundClient.post`): a 3xx is answered to the caller as it
  is, and the caller treats it as a failure. A hop would be a connection the user named
  nowhere; rather than check each, there is none.
- No cookie jar (one session serves every user), no proxy or netrc from the environment.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client import _RequestContextManager
from aiohttp.connector import AddrInfoType
from aiohttp.resolver import DefaultResolver

from controlplane.outbound.policy import DestinationRefused, OutboundPolicy


class GuardedResolver(AbstractResolver):
    """Resolves as usual, then keeps only the addresses the policy allows for that port
    (raising DestinationRefused with the reasons when none is left)."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self._inner = DefaultResolver()
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        reasons: dict[str, None] = {}
        for item in found:
            try:
                self._policy.check(item["host"], port)
            except DestinationRefused as exc:
                reasons[str(exc)] = None
                continue
            allowed.append(item)
        if not allowed:
            raise DestinationRefused(f"{host}: " + "; ".join(reasons))
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class OutboundClient:
    """An aiohttp session of its own (made on first use, on the running loop) whose every
    connection the policy allowed, and which follows no redirect."""

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        limit: int = 100,
        ttl_dns_cache: int | None = 10,
        auto_decompress: bool = True,
    ) -> None:
        self.policy = policy
        self._limit = limit
        self._ttl_dns_cache = ttl_dns_cache
        self._auto_decompress = auto_decompress
        self._session: aiohttp.ClientSession | None = None

    def _socket(self, addr_info: AddrInfoType) -> socket.socket:
        """aiohttp's socket factory: the address is checked as it is about to be connected."""
        family, kind, proto, _, address = addr_info
        self.policy.check(str(address[0]), int(address[1]))
        return socket.socket(family, kind, proto)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                resolver=GuardedResolver(self.policy),
                ttl_dns_cache=self._ttl_dns_cache,
                socket_factory=self._socket,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=self._auto_decompress,
            )
        return self._session

    def post(self, url: str, **kwargs: Any) -> _RequestContextManager:
        """session.post, never following a redirect."""
        return self.session.post(url, allow_redirects=False, **kwargs)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def refusal_of(exc: BaseException) -> DestinationRefused | None:
    """The policy's refusal behind an aiohttp connection error, if that is what it was."""
    if isinstance(exc, DestinationRefused):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, DestinationRefused
    ):
        return exc.os_error
    return None
