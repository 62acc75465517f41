"""The events WebSocket's per-user cap (events/socket_cap.py), from another user's side: one
user opening sockets past the cap is refused with a 429 in the JSON error format, and does not
take the events reader pool from everyone else: another user's socket still gets its events.

The reader pool is made small (as many connections as the flooding user tries to open), so
that without the cap the flood would hold every reader connection; the records are written
straight to Redis (no sandbox needed)."""

from __future__ import annotations

import asyncio
import json
import secrets

import aiohttp
import redis.asyncio as aioredis
from multidict import CIMultiDict

from controlplane import keys
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from tests.support.records import NO_ENGINE, event, sandbox_record
from tests.support.types import Client, ClientFactory, UserHeaders

CAP = 3
POOL = 6  # the reader pool: the flood would take all of it without the cap
SOCKET = "/api/v1/events/socket"


async def _conversation(
    client: Client, raw_redis: aioredis.Redis, owner: str
) -> tuple[str, str, str]:
    """(sandbox id, conversation id, the sandbox's session key) of a recorded sandbox."""
    key = secrets.token_urlsafe(32)
    record = sandbox_record(owner, SandboxStatus.RUNNING, key)
    assert await SandboxStore(raw_redis, client.app[keys.SECRET_BOX]).create(record, 0, Limits())
    conversation_id = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=conversation_id, created_by_user_id=owner, sandbox_id=record.id)
    )
    return record.id, conversation_id, key


async def test_one_users_socket_flood_is_capped_and_others_still_get_events(
    make_client: ClientFactory, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client = await make_client(
        with_sandboxes=True,
        docker_url=NO_ENGINE,
        max_event_sockets_per_user=CAP,
        redis_max_connections=POOL,
        redis_pool_timeout=2.0,
    )
    alice, bob = await user_headers("alice"), await user_headers("bob")
    _, alices, _ = await _conversation(client, raw_redis, "alice")
    bobs_sandbox, bobs, bobs_key = await _conversation(client, raw_redis, "bob")

    # Alice floods: as many sockets as the reader pool has connections.
    opened: list[aiohttp.ClientWebSocketResponse] = []
    refused: list[tuple[int, str | None]] = []
    for _ in range(POOL):
        url = f"{SOCKET}?conversation_id={alices}"
        try:
            opened.append(await client.ws_connect(url, headers=alice))
        except aiohttp.WSServerHandshakeError as exc:
            refused.append((exc.status, CIMultiDict(exc.headers or {}).get("Retry-After")))
    assert len(opened) == CAP
    assert refused == [(429, "1")] * (POOL - CAP)
    # The refusal is the JSON error format, said before the upgrade.
    resp = await client.get(
        f"{SOCKET}?conversation_id={alices}",
        headers={
            **alice,
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert resp.status == 429
    assert "event sockets are open for this user" in (await resp.json())["detail"]
    assert client.app[keys.SOCKET_CAP].open_for("alice") == CAP

    # Bob's socket is accepted and gets his agent's events while alice's sockets stay open.
    async with client.ws_connect(f"{SOCKET}?conversation_id={bobs}", headers=bob) as ws:
        await asyncio.sleep(0.2)  # the socket's first read is blocking
        posted = [event(n=n) for n in range(3)]
        resp = await client.post(
            f"/api/v1/webhooks/{bobs_sandbox}/events/{bobs}",
            json=posted,
            headers={"X-Session-API-Key": bobs_key},
        )
        assert resp.status == 200, await resp.text()
        got = [json.loads((await ws.receive(timeout=1.5)).data) for _ in posted]
        assert [e["id"] for e in got] == [e["id"] for e in posted]

    # Alice closes one: she may open one again (the count follows the sockets' ends).
    await opened.pop().close()
    for _ in range(100):
        if client.app[keys.SOCKET_CAP].open_for("alice") < CAP:
            break
        await asyncio.sleep(0.02)
    opened.append(await client.ws_connect(f"{SOCKET}?conversation_id={alices}", headers=alice))
    for ws in opened:
        await ws.close()
