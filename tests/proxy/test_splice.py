"""Large bodies relayed by splice(2) (controlplane/proxy/splice.py) through forward_http, between
real sockets: an upstream aiohttp server on loopback and a client of a front app that forwards
to it. What a download must survive: keep-alive after it, a client leaving in the middle, an
upstream breaking or stalling in the middle; and what must not be spliced."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from controlplane.proxy import splice
from controlplane.proxy.forward import Limits, Outgoing, forward_http
from controlplane.proxy.state import proxy_client
from tests.support.log_capture import capture_logs

MIB = 1024 * 1024
READ_TIMEOUT = 1.0
Server = Callable[..., Awaitable[TestServer]]


def pattern(size: int) -> bytes:
    """Bytes whose every position differs from its neighbours' (a shifted or lost piece shows)."""
    block = bytes(range(251)) * (MIB // 251 + 1)
    return (block * (size // len(block) + 1))[:size]


async def big(request: web.Request) -> web.Response:
    return web.Response(body=pattern(int(request.query["size"])))


async def chunked(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.enable_chunked_encoding()
    await response.prepare(request)
    body = pattern(4 * MIB)
    for start in range(0, len(body), MIB):
        await response.write(body[start : start + MIB])
    await response.write_eof()
    return response


async def broken(request: web.Request) -> web.StreamResponse:
    """Declares 8 MiB, sends 3, then closes the connection (or stalls, with ?stall)."""
    response = web.StreamResponse()
    response.content_length = 8 * MIB
    await response.prepare(request)
    await response.write(pattern(3 * MIB))
    if "stall" in request.query:
        await asyncio.sleep(READ_TIMEOUT * 5)
    assert request.transport is not None
    request.transport.close()
    return response


@pytest.fixture
async def front(aiohttp_server: Server) -> AsyncIterator[URL]:
    upstream_app = web.Application()
    upstream_app.router.add_get("/big", big)
    upstream_app.router.add_get("/chunked", chunked)
    upstream_app.router.add_get("/broken", broken)
    upstream = await aiohttp_server(upstream_app, host="127.0.0.1")
    http = proxy_client()

    async def forward(request: web.Request) -> web.StreamResponse:
        url = upstream.make_url(request.match_info["path"]).with_query(request.query)
        return await forward_http(
            request, http, Outgoing(url=url), Limits(max_body=MIB, read_timeout=READ_TIMEOUT)
        )

    front_app = web.Application()
    front_app.router.add_route("*", "/{path:.*}", forward)
    server = await aiohttp_server(front_app, host="127.0.0.1")
    yield server.make_url("/")
    await http.close()


async def download(session: aiohttp.ClientSession, url: URL) -> bytes:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.read()


def spliced(logs: Any) -> list[int]:
    return [int(e["bytes"]) for e in logs.events("proxy_body_spliced")]


async def test_large_bodies_are_spliced_whole_and_keep_alive_holds(front: URL) -> None:
    sizes = [MIB, 8 * MIB + 7, 33 * MIB + 1]
    connector = aiohttp.TCPConnector(limit=1)  # every download on the same client connection
    with capture_logs("info") as logs:
        async with aiohttp.ClientSession(connector=connector) as session:
            for size in sizes:
                body = await download(session, front / "big" % {"size": str(size)})
                assert len(body) == size
                assert hashlib.sha256(body).digest() == hashlib.sha256(pattern(size)).digest()
            small = await download(session, front / "big" % {"size": "1000"})
    assert small == pattern(1000)
    assert spliced(logs) == sizes, "each large body spliced, the small one copied"
    assert connector._acquired == set()  # the connection was given back for reuse each time


async def test_what_is_not_spliced_is_still_relayed(front: URL) -> None:
    with capture_logs("info") as logs:
        async with aiohttp.ClientSession() as session:
            assert await download(session, front / "chunked") == pattern(4 * MIB)
            async with session.head(front / "big" % {"size": str(8 * MIB)}) as head:
                assert head.status == 200
                assert head.content_length == 8 * MIB
    assert spliced(logs) == []


async def test_a_client_leaving_mid_body_leaves_the_proxy_serving(front: URL) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(front / "big" % {"size": str(64 * MIB)})
        await response.content.readexactly(MIB)
        response.close()  # the connection is closed with 63 MiB still to come
        await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as session:
        body = await download(session, front / "big" % {"size": str(5 * MIB)})
    assert body == pattern(5 * MIB)


@pytest.mark.parametrize("query", ["", "stall"])
async def test_an_upstream_breaking_mid_body_breaks_the_clients_download(
    front: URL, query: str
) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(front / "broken" % ({query: "1"} if query else {}))
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(response.read(), READ_TIMEOUT * 4)
        response.close()
        # The proxy goes on serving.
        assert await download(session, front / "big" % {"size": str(2 * MIB)}) == pattern(2 * MIB)


def test_splice_is_available_here() -> None:
    # The tests above would pass on the copying path too, but their log assertions would not:
    # this machine (Linux, Python >= 3.10) must take the splice path.
    assert splice.available()
