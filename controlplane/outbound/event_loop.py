"""A whole process held to an outbound policy: the event loop of the LLM gateway's translator.

LiteLLM makes its connections itself, through whichever HTTP stack a provider's code uses
(its aiohttp transport, httpx, a provider's SDK) and after resolving names itself. Every one
of them, on asyncio, ends in `loop.sock_connect(sock, address)` with the address about to be
connected: `GuardedEventLoop` checks it there, against the policy of the request being served
(`current`, a context variable the request's handler sets), so the address checked is the
address connected to, a name that resolves differently at LiteLLM's lookup gains nothing, and
a redirect a library follows is checked like any other connection. A connection made outside
a request (with no policy) is refused; so is anything but TCP over IPv4 or IPv6.
"""

from __future__ import annotations

import asyncio
import socket
from contextvars import ContextVar
from typing import Any

from controlplane.outbound.policy import DestinationRefused, OutboundPolicy

current: ContextVar[OutboundPolicy | None] = ContextVar("acs_outbound_policy", default=None)
"""The policy of the request being served (None: refuse everything)."""
refusals: ContextVar[list[str] | None] = ContextVar("acs_outbound_refusals", default=None)
"""Where the request's handler collects what was refused (libraries wrap the error)."""


class GuardedEventLoop(asyncio.SelectorEventLoop):
    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                raise DestinationRefused(f"no {sock.family.name} connection is made for a user")
            policy = current.get()
            if policy is None:
                raise DestinationRefused("a connection outside any request")
            policy.check(str(address[0]), int(address[1]))
        except DestinationRefused as exc:
            noted = refusals.get()
            if noted is not None:
                noted.append(str(exc))
            raise
        await super().sock_connect(sock, address)
