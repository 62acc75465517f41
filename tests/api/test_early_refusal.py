"""Refusals cost no body read: a request without a valid key (or too large, or to nowhere) is
answered while its body is still on the way, and the connection is closed rather than drained.
Raw sockets, so that the test controls exactly how much of the body has been sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from tests.conftest import BOOTSTRAP_KEY
from tests.support.log_capture import capture_logs

DECLARED = 900_000  # under the 1 MiB body limit: refused for the key, not the size


@pytest.fixture
async def port(make_config: Callable[..., ServiceConfig]) -> AsyncIterator[int]:
    runner = web.AppRunner(create_app(make_config(), with_sandboxes=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
    await runner.cleanup()


Send = Callable[..., Awaitable[tuple[int, dict[str, str], Any, float]]]


@pytest.fixture
def partial(port: int) -> Send:
    """Send the head of a request declaring `length` body bytes and only `sent` of them; return
    the status, headers, JSON body, and the seconds until the server closed the connection."""

    async def send(
        method: str, path: str, headers: dict[str, str], length: int = DECLARED, sent: int = 10
    ) -> tuple[int, dict[str, str], Any, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
        lines += ["Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + b"{" * sent)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status = int(head.split(b" ", 2)[1])
        fields = dict(
            line.decode().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
        )
        body = await asyncio.wait_for(reader.readexactly(int(fields["Content-Length"])), 5)
        started = time.monotonic()
        rest = await asyncio.wait_for(reader.read(), 5)  # EOF: the server closed
        closed_after = time.monotonic() - started
        assert rest == b""
        writer.close()
        return status, {k.lower(): v for k, v in fields.items()}, json.loads(body), closed_after

    return send


@pytest.mark.parametrize(
    ("headers", "path", "status"),
    [
        ({}, "/api/settings", 401),  # no key
        ({"X-Session-API-Key": "not-a-key"}, "/api/settings", 401),  # malformed
        ({"Authorization": "Bearer acs_0123456789ab_" + "x" * 43}, "/api/settings", 401),
        ({}, "/api/v1/no-such-route", 404),  # routes that skip auth must not read it either
        ({}, "/api/v1/webhooks/0123/events/abc", 401),  # the sandbox webhook, no sandbox key
        ({"X-Session-API-Key": "x" * 43}, "/api/v1/webhooks/0123/conversations", 401),
    ],
)
async def test_a_refusal_is_answered_before_the_body_and_closes(
    partial: Send, headers: dict[str, str], path: str, status: int
) -> None:
    code, fields, body, closed_after = await partial("POST", path, headers)
    assert code == status, body
    assert "detail" in body
    assert fields["connection"] == "close"
    assert closed_after < 1, "the server drained the body instead of closing"


async def test_too_large_is_refused_before_the_body(partial: Send) -> None:
    headers = {"X-Session-API-Key": BOOTSTRAP_KEY}
    code, fields, _body, closed_after = await partial(
        "POST", "/api/settings", headers, length=64 * 1024 * 1024
    )
    assert code == 413
    assert fields["connection"] == "close"
    assert closed_after < 1


async def test_an_authenticated_request_waits_for_its_body(port: int) -> None:
    """The control: with a good key, the server reads the body before it answers."""
    body = json.dumps({"llm_model": "gpt-4o-mini"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /api/settings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Session-API-Key: {BOOTSTRAP_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body[:5])
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
    writer.write(body[5:])
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert b"Connection: close" not in answer  # kept alive as usual
    writer.close()


async def test_unauthenticated_requests_are_paced_and_keyed_ones_are_not(
    make_config: Callable[..., ServiceConfig],
) -> None:
    """Past the budget (20/s, bursts of 40 here) answers without a principal wait for their
    slot; a request with a key goes through at once meanwhile; the flood gets one summary log
    line instead of one line each."""
    config = make_config(unauthenticated_rate=20)
    runner = web.AppRunner(create_app(config, with_sandboxes=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def refused() -> float:
                started = time.monotonic()
                async with http.get(f"{base}/api/settings") as resp:
                    assert resp.status == 401
                return time.monotonic() - started

            with capture_logs("info") as logs:
                began = time.monotonic()
                flood = [asyncio.create_task(refused()) for _ in range(80)]
                await asyncio.sleep(0.3)
                headers = {"X-Session-API-Key": BOOTSTRAP_KEY}
                async with http.get(f"{base}/api/settings", headers=headers) as resp:
                    assert resp.status == 200
                keyed = time.monotonic() - began
                waits = sorted(await asyncio.gather(*flood))
        # 40 within the burst; the other 40 one every 50 ms: the last about 2 s later. Compared
        # with each other, not with the clock: on a loaded host the whole flood can start late
        # (its first answers 1.5 s after it was sent, once, in a full run), pacing or not.
        assert waits[-1] - waits[30] > 1.0, waits
        assert waits[-1] > 1.5, waits
        # The keyed request, sent 0.3 s into the flood, did not queue behind the paced ones.
        assert keyed < waits[-1] - 0.5, (keyed, waits)
        assert len(logs.events("request")) < 60, "paced requests must not log a line each"
        (summary,) = logs.events("unauthenticated_requests_paced")
        assert summary["count"] == 1  # the first; the next after 10 s
        assert summary["level"] == "warning"
    finally:
        await runner.cleanup()
