"""One call through the gateway, from its admission (service.py `GatewayService.call`) to what it
cost: the handler asks for it, then for its answer, and writes that out.

`AdmittedCall.answer()` forwards the call (forward.py): a non-streamed answer comes back as its
bytes, already settled (metered and observed); a stream as the events to write, which the
handler settles with the status it ended with (200, or 499 when the client left), since only
the handler knows when the last byte went out. A GatewayError from forwarding is settled with
its status before it is raised.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.gateway.answers import Metered
from controlplane.gateway.credentials import Caller
from controlplane.gateway.forward import Forwarder, GatewayError
from controlplane.gateway.upstream import Upstream

BodyReader = Callable[[int], Awaitable[tuple[dict[str, Any], bytes]]]
"""The request's body, at most that many bytes: as a dict and as sent (the handler reads and
checks it; GatewayError 400 or 413). Called once the credential can be genuine."""


@dataclass(frozen=True)
class Call:
    caller: Caller
    model: str
    """The configured model (the conversation's, or the user's settings')."""
    upstream: Upstream
    started: float = field(default_factory=time.perf_counter)


Settle = Callable[[Call, dict[str, Any], Metered, int], object]


@dataclass
class AdmittedCall:
    call: Call
    body: dict[str, Any]
    raw: bytes
    """The body as the client sent it (forwarded as it is unless something must change)."""
    forwarder: Forwarder
    settled_by: Settle
    metered: Metered = field(default_factory=Metered)

    @property
    def caller(self) -> Caller:
        return self.call.caller

    async def answer(self) -> bytes | AsyncIterator[bytes]:
        """The upstream's answer: a chat completion's bytes (settled), or a stream's events (to
        `settle` once written). Raises GatewayError (settled)."""
        stream = self.body.get("stream") is True
        upstream = self.call.upstream
        try:
            response = await self.forwarder.open(
                upstream, self.body, self.raw, stream, self.metered
            )
            if not stream:
                translated = upstream.via == "translator"
                raw = await self.forwarder.read_json(response, self.metered, translated=translated)
        except GatewayError as exc:
            self.settle(exc.status)
            raise
        if not stream:
            self.settle(200)
            return raw
        options = self.body.get("stream_options")
        wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return self.forwarder.relay(
            response, self.metered, keep_usage_chunk=wants_usage, secret=upstream.api_key
        )

    def settle(self, status: int) -> None:
        """Record what the call cost and observe it (GatewayService.settle)."""
        self.settled_by(self.call, self.body, self.metered, status)
