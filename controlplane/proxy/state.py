"""What the sandbox proxy (routes.py) keeps between requests: its HTTP client, its open
WebSockets, when each sandbox was last touched, the access it recently granted and the
containers' addresses. Made and closed by the wiring (controlplane/wiring.py, `proxy_ctx`)."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from controlplane.proxy.forward import CHUNK
from controlplane.sandboxes.models import SandboxRecord

GRANT_TTL = 2.0
MAX_GRANTS = 10_000


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


class ProxyState:
    """The proxy's HTTP client, its open WebSockets, when each sandbox was last touched, and
    the access it recently granted.

    A grant (a credential allowed to use a sandbox, with the sandbox's record) is kept for
    GRANT_TTL seconds so that a page's hundred requests do not each cost two Redis round trips
    and a decryption; any change of the sandbox (its status feed: pause, delete, …) forgets
    it at once. So a revoked API key or an ended browser session still works for up to
    GRANT_TTL seconds on a sandbox it just used."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.sockets: set[web.WebSocketResponse] = set()
        self.touched: dict[str, float] = {}
        self.grants: dict[tuple[str, str], tuple[float, SandboxRecord, bool]] = {}
        self.addresses: dict[str, str] = {}  # sandbox id -> its container's address ("": none)

    def granted(self, sandbox_id: str, credential: str) -> tuple[SandboxRecord, bool] | None:
        """(record, by the sandbox's own key) if access was granted less than GRANT_TTL ago."""
        grant = self.grants.get((sandbox_id, credential))
        if grant is None or grant[0] < time.monotonic():
            return None
        return grant[1], grant[2]

    def grant(self, record: SandboxRecord, credential: str, own_key: bool) -> None:
        if len(self.grants) >= MAX_GRANTS:
            now = time.monotonic()
            self.grants = {k: v for k, v in self.grants.items() if v[0] >= now}
            if len(self.grants) >= MAX_GRANTS:
                self.grants.clear()
        self.grants[(record.id, credential)] = (time.monotonic() + GRANT_TTL, record, own_key)

    def forget(self, sandbox_id: str) -> None:
        for key in [k for k in self.grants if k[0] == sandbox_id]:
            self.grants.pop(key, None)
        self.addresses.pop(sandbox_id, None)

    async def close_sockets(self) -> None:
        """At shutdown, as the events WebSocket: clients reconnect through another replica."""
        for ws in list(self.sockets):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")
