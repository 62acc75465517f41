"""What the sandbox proxy (routes.py) keeps between requests: its HTTP client, its open
WebSockets, when each sandbox was last touched, the access it recently granted and the
containers' addresses. Made and closed by the wiring (controlplane/wiring.py, `proxy_ctx`).

Both caches are only as good as the news of changes: the status feed (a change of a sandbox on
any replica forgets what is held of it; a feed that was down forgets everything, and while it is
down nothing is trusted). On top of that each entry expires, an address is used only for the
record generation it was looked up for (a re-create, a resume or a failover writes a new one),
and a lookup that a change overtook is not kept (`seen`, `Version`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from controlplane.proxy.forward import (
    CHUNK,
    Limits,
    Outgoing,
    forward_http,
    forward_websocket,
)
from controlplane.sandboxes.models import SandboxRecord

GRANT_TTL = 2.0
TOUCH_EVERY = 30.0
"""Proxied traffic is activity (the idle reaper): recorded at most this often per sandbox."""
ADDRESS_TTL = 10.0
"""A container's address is looked up again this often even when no change was heard: a change
lost on a connection that stayed up (a partitioned Redis master) costs at most this long."""
MAX_GRANTS = 10_000
MAX_TRACKED = 100_000
"""Sandboxes whose changes are counted (Version); past it everything is forgotten at once."""

Version = tuple[int, int]
"""(resets, changes of one sandbox) when a lookup began: kept only if both are still so."""


def proxy_client() -> aiohttp.ClientSession:
    """The proxy's client: no decompression (bodies pass as they are), no headers of its own,
    no limit on connections (each sandbox is one upstream host)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        read_bufsize=CHUNK,  # large reads: a download is copied in few, big pieces
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Accept", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


@dataclass(frozen=True)
class _Grant:
    expires: float
    record: SandboxRecord
    own_key: bool


@dataclass(frozen=True)
class _Address:
    expires: float
    generation: int
    address: str  # "": the container has none (the published port is used)


class ProxyState:
    """The proxy's HTTP client and open WebSockets (what it forwards with), when each sandbox
    was last touched, the access it recently granted and the addresses it looked up (an
    AddressCache of controlplane/sandboxes/service.py).

    A grant (a credential allowed to use a sandbox, with the sandbox's record) is kept for
    GRANT_TTL seconds so that a page's hundred requests do not each cost two Redis round trips
    and a decryption; any change of the sandbox (its status feed: pause, delete, …) forgets
    it at once. So a revoked API key or an ended browser session still works for up to
    GRANT_TTL seconds on a sandbox it just used."""

    def __init__(
        self, http: aiohttp.ClientSession, synced: Callable[[], bool] = lambda: True
    ) -> None:
        """`synced()`: whether every change is being heard (StatusFeed.synced); while it is
        False nothing cached is used or kept."""
        self._http = http
        self._sockets: set[web.WebSocketResponse] = set()
        self._touched: dict[str, float] = {}
        self._synced = synced
        self._grants: dict[tuple[str, str], _Grant] = {}
        self._addresses: dict[str, _Address] = {}
        self._resets = 0
        self._changes: dict[str, int] = {}

    async def forward_http(
        self, request: web.Request, out: Outgoing, limits: Limits
    ) -> web.StreamResponse:
        """`request` sent as `out` says, the answer streamed back (forward.py). Raises
        ProxyError."""
        return await forward_http(request, self._http, out, limits)

    async def forward_websocket(
        self, request: web.Request, out: Outgoing, limits: Limits
    ) -> web.StreamResponse:
        """The WebSocket relayed both ways until either side closes (closed at shutdown:
        `close_sockets`). Raises ProxyError."""
        return await forward_websocket(request, self._http, out, limits, self._sockets)

    def touch_due(self, sandbox_id: str) -> bool:
        """Whether proxied traffic to the sandbox is to be recorded as activity now (at most
        every TOUCH_EVERY seconds per sandbox, from this process); counted as done."""
        now = time.monotonic()
        if now - self._touched.get(sandbox_id, 0.0) < TOUCH_EVERY:
            return False
        self._touched[sandbox_id] = now
        return True

    def version(self, sandbox_id: str) -> Version:
        """Taken before reading a sandbox's record: what `grant` and `remember` check."""
        return self._resets, self._changes.get(sandbox_id, 0)

    def granted(self, sandbox_id: str, credential: str) -> tuple[SandboxRecord, bool] | None:
        """(record, by the sandbox's own key) if access was granted less than GRANT_TTL ago."""
        grant = self._grants.get((sandbox_id, credential))
        if grant is None or grant.expires < time.monotonic() or not self._synced():
            return None
        return grant.record, grant.own_key

    def grant(self, record: SandboxRecord, credential: str, own_key: bool, seen: Version) -> None:
        """Remember a grant made from a record read after `seen = version(record.id)`, unless
        the sandbox changed (or everything was forgotten) since."""
        if seen != self.version(record.id) or not self._synced():
            return
        if len(self._grants) >= MAX_GRANTS:
            now = time.monotonic()
            self._grants = {k: v for k, v in self._grants.items() if v.expires >= now}
            if len(self._grants) >= MAX_GRANTS:
                self._grants.clear()
        expires = time.monotonic() + GRANT_TTL
        self._grants[(record.id, credential)] = _Grant(expires, record, own_key)

    def address(self, record: SandboxRecord) -> str | None:
        """The container address looked up for this very generation of the sandbox, if fresh;
        None: look it up (and `remember` it)."""
        found = self._addresses.get(record.id)
        if (
            found is None
            or found.generation != record.generation
            or found.expires < time.monotonic()
            or not self._synced()
        ):
            return None
        return found.address

    def remember(self, record: SandboxRecord, address: str, seen: Version) -> None:
        if seen != self.version(record.id) or not self._synced():
            return
        self._addresses[record.id] = _Address(
            time.monotonic() + ADDRESS_TTL, record.generation, address
        )

    def forget(self, sandbox_id: str) -> None:
        """The sandbox changed (on some replica): what is held of it, and any lookup of it in
        flight, is stale."""
        if len(self._changes) >= MAX_TRACKED:
            self.forget_all()
        self._changes[sandbox_id] = self._changes.get(sandbox_id, 0) + 1
        for key in [k for k in self._grants if k[0] == sandbox_id]:
            self._grants.pop(key, None)
        self._addresses.pop(sandbox_id, None)

    def forget_all(self) -> None:
        """Changes may have been missed (the status feed was down): nothing held is good."""
        self._resets += 1
        self._changes.clear()
        self._grants.clear()
        self._addresses.clear()

    async def close_sockets(self) -> None:
        """At shutdown, as the events WebSocket: clients reconnect through another replica."""
        for ws in list(self._sockets):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        await self._http.close()
