"""Forwarding one HTTP request or WebSocket to an upstream URL and streaming the answer back:
the core of the sandbox proxy (routes.py), and of anything else that relays a client's request
to a sandbox. It knows nothing of who may call whom: callers authorize first, then say what to
send and what to strip.

- Both directions stream: the request body is sent as it arrives, the response as it comes,
  each write waiting for the other side to take it (backpressure: a slow client slows the
  sandbox's sending down, never fills this process's memory).
- Limits: the request body (`Limits.max_body`, 413 before a byte is sent when declared, the
  connection closed when a chunked body runs over), the wait for the answer and between two of
  its chunks (`Limits.read_timeout`: 504 when no answer began), connecting (502).
- A large body of a known length moves from socket to socket inside the kernel (splice.py);
  anything else is copied through this process as it comes.
- Bodies are passed as they are, compressed or not; hop-by-hop headers are not forwarded
  (RFC 9110 §7.6.1), and the caller filters the answer's (`Outgoing.answer_headers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
import structlog
from aiohttp import WSMsgType, web
from aiohttp.payload import AsyncIterablePayload
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from controlplane.proxy import splice

log = structlog.get_logger(__name__)

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
WS_HANDSHAKE = frozenset(
    h.lower()
    for h in (
        "Sec-WebSocket-Key",
        "Sec-WebSocket-Version",
        "Sec-WebSocket-Extensions",
        "Sec-WebSocket-Protocol",
        "Sec-WebSocket-Accept",
    )
)
CHUNK = 1024 * 1024
WRITE_BUFFER = 4 * CHUNK


class ProxyError(Exception):
    """The upstream could not be reached or answered nothing in time: status 502 or 504."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Body:
    """The client's body as it arrives, cut off past `limit` (aiohttp reports the error raised
    here as a client error of its own: `overflowed` tells the two apart)."""

    def __init__(self, content: aiohttp.StreamReader, limit: int) -> None:
        self.content = content
        self.limit = limit
        self.overflowed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        sent = 0
        async for chunk in self.content.iter_chunked(CHUNK):
            sent += len(chunk)
            if sent > self.limit:
                self.overflowed = True
                raise ValueError(f"request body is larger than {self.limit} bytes")
            yield chunk


@dataclass(frozen=True)
class Limits:
    max_body: int
    read_timeout: float
    connect_timeout: float = 5.0


@dataclass
class Outgoing:
    """What to send upstream besides the client's own request."""

    url: URL
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    """Request headers, already filtered and completed by the caller."""
    answer_headers: Callable[[Iterable[tuple[str, str]]], list[tuple[str, str]]] | None = None
    """The answer's headers (hop-by-hop ones already left out) as they may go back; None passes
    them as they are."""
    add_response: Mapping[str, str] = field(default_factory=dict)


def request_headers(
    headers: CIMultiDictProxy[str], *, strip: Iterable[str] = ()
) -> CIMultiDict[str]:
    """The client's headers without hop-by-hop ones, the headers named in a Connection header,
    WebSocket handshake headers (the upstream handshake makes its own) and `strip`."""
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",") if h.strip()}
    drop = HOP_BY_HOP | WS_HANDSHAKE | named | {h.lower() for h in strip}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


async def forward_http(
    request: web.Request, http: aiohttp.ClientSession, out: Outgoing, limits: Limits
) -> web.StreamResponse:
    """Send `request` to `out.url` and stream the answer back. Raises ProxyError (before any
    byte of an answer was sent) and web.HTTPRequestEntityTooLarge."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body:
        raise web.HTTPRequestEntityTooLarge(max_size=limits.max_body, actual_size=declared)
    headers = CIMultiDict(out.headers)
    if declared is not None:
        headers["Content-Length"] = str(declared)
    body = _Body(request.content, limits.max_body) if request.body_exists else None
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=limits.connect_timeout, sock_read=limits.read_timeout
    )
    try:
        upstream = await http.request(
            request.method,
            out.url,
            headers=headers,
            # The payload aiohttp would choose for a generator, made here: its registry's lookup
            # tries each payload type's ABC in turn (~30 us a request).
            data=AsyncIterablePayload(body.chunks()) if body is not None else None,
            timeout=timeout,
            allow_redirects=False,
            auto_decompress=False,
            compress=None,
        )
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        if body is not None and body.overflowed:
            raise web.HTTPRequestEntityTooLarge(
                max_size=limits.max_body,
                actual_size=limits.max_body + 1,
                text=f"request body is larger than {limits.max_body} bytes",
            ) from None
        if isinstance(exc, TimeoutError):
            raise ProxyError(504, f"no answer in {limits.read_timeout:g} s") from None
        if isinstance(exc, ValueError):
            raise
        raise ProxyError(502, f"does not answer ({type(exc).__name__})") from None
    _read_big(upstream)
    async with upstream:
        return await _stream_back(request, upstream, out, limits.read_timeout)


def _read_big(upstream: aiohttp.ClientResponse) -> None:
    """Receive from the sandbox in pieces of up to CHUNK rather than asyncio's 256 KiB: what a
    large download costs this process goes with the number of pieces, not their size."""
    connection = upstream.connection
    transport = connection.transport if connection is not None else None
    if transport is not None and hasattr(transport, "max_size"):
        transport.max_size = CHUNK


async def _stream_back(
    request: web.Request, upstream: aiohttp.ClientResponse, out: Outgoing, read_timeout: float
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    passed = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
    for name, value in out.answer_headers(passed) if out.answer_headers else passed:
        response.headers.add(name, value)
    response.headers.update(out.add_response)
    if upstream.content_length is not None:  # a HEAD answer says it too (RFC 9110 §8.6)
        response.content_length = upstream.content_length
    await response.prepare(request)
    if request.transport is not None:
        # Room for a chunk or two in flight to the client while the next is read (each write
        # still waits once that is full: the client's pace is the sandbox's).
        request.transport.set_write_buffer_limits(high=WRITE_BUFFER)
    try:
        if (how := splice.plan(request, upstream)) is not None:
            await splice.relay(how, response, upstream, read_timeout)
        else:
            while chunk := await upstream.content.readany():  # as received: no joining copy
                await response.write(chunk)  # waits while the client is slow
    except (aiohttp.ClientError, TimeoutError, splice.UpstreamBroke) as exc:
        # The answer has begun: the only way to say it broke is to break the connection.
        log.info("proxy_upstream_broke", error=type(exc).__name__, detail=str(exc))
        if request.transport is not None:
            request.transport.close()
        return response
    except splice.ClientGone:
        upstream.close()
        return response
    await response.write_eof()
    return response


async def forward_websocket(
    request: web.Request,
    http: aiohttp.ClientSession,
    out: Outgoing,
    limits: Limits,
    sockets: set[web.WebSocketResponse] | None = None,
) -> web.StreamResponse:
    """Open the upstream WebSocket first (its refusal is the client's: the same status), then
    accept the client's and relay messages both ways until either side closes. Raises
    ProxyError when the upstream cannot be reached."""
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p
    ]
    try:
        upstream = await http.ws_connect(
            out.url,
            headers=out.headers,
            protocols=protocols,
            max_msg_size=limits.max_body,
            timeout=aiohttp.ClientWSTimeout(ws_close=10),
            autoping=True,
            compress=0,
        )
    except aiohttp.WSServerHandshakeError as exc:
        return web.json_response(
            {"detail": f"the sandbox refused the WebSocket ({exc.status})"},
            status=exc.status if 400 <= exc.status < 600 else 502,
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ProxyError(502, f"does not answer ({type(exc).__name__})") from None
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (),
        max_msg_size=limits.max_body,
        heartbeat=30,
    )
    client.headers.update(out.add_response)
    try:
        await client.prepare(request)
        if sockets is not None:
            sockets.add(client)
        await _relay(client, upstream)
    finally:
        if sockets is not None:
            sockets.discard(client)
        await upstream.close()
        await client.close()
    return client


async def _relay(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    """Both directions at once; each send waits for its side to take the message."""

    async def pump(
        source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
        sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    ) -> None:
        async for message in source:
            if message.type == WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:  # CLOSE, ERROR
                break
        code = source.close_code
        await sink.close(code=code if code and code >= 1000 else 1000)

    downstream = asyncio.create_task(pump(upstream, client))
    upstream_task = asyncio.create_task(pump(client, upstream))
    try:
        await asyncio.wait({downstream, upstream_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (downstream, upstream_task):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await asyncio.gather(downstream, upstream_task, return_exceptions=True)
