"""Posting events through the webhook and reading them off events WebSockets, for the tests of
the events socket's shared read (tests/events/test_fanout*.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest

from tests.support.records import event
from tests.support.types import Client

SOCKET = "/api/v1/events/socket"


async def post_events(
    client: Client, sandbox: str, cid: str, key: dict[str, str], n: int
) -> list[str]:
    """`n` new events posted to the conversation with the sandbox's key; their ids."""
    posted = [event(n=i) for i in range(n)]
    resp = await client.post(f"/api/v1/webhooks/{sandbox}/events/{cid}", json=posted, headers=key)
    assert resp.status == 200, await resp.text()
    return [e["id"] for e in posted]


async def frames(ws: aiohttp.ClientWebSocketResponse, n: int, timeout: float = 5) -> list[str]:
    """The next `n` text frames, as sent."""
    out: list[str] = []
    for _ in range(n):
        message = await ws.receive(timeout=timeout)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        out.append(message.data)
    return out


async def event_ids(ws: aiohttp.ClientWebSocketResponse, n: int, timeout: float = 5) -> list[str]:
    """The ids of the next `n` frames, each one event's JSON object."""
    out: list[str] = []
    for data in await frames(ws, n, timeout):
        frame = json.loads(data)
        assert isinstance(frame, dict), data
        out.append(frame["id"])
    return out


async def nothing_more(ws: aiohttp.ClientWebSocketResponse) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await ws.receive(timeout=0.3)


async def until(check: Callable[[], bool], seconds: float = 4.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    assert check()
