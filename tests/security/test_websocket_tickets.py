"""Finding 8 of issue 26 (its second half): keys in WebSocket URLs end up in ingress logs, so a
client can open its sockets with a short-lived, single-use ticket instead. Attacked from where
the attackers are: no key at all, another user's key and tickets, a ticket seen once (replayed),
a ticket for another target; and the control plane's own log lines never hold a key or a ticket
that came in a query string.

The events socket is served by an app whose conversation records are written straight to Redis
(no sandbox needed); the proxy's WebSocket reaches a real sandbox's echo server."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from typing import Any

import aiohttp
import docker
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.store import keyspace, text
from tests.support.live_server import Api, LiveServer, LiveServerFactory
from tests.support.log_capture import LogCapture, capture_logs
from tests.support.proxy_app import PROXIED_SPEC, serve_app
from tests.support.records import NO_ENGINE
from tests.support.types import ClientFactory

TICKETS = "/api/v1/websocket-tickets"
SOCKET = "/api/v1/events/socket"


async def _conversation(raw_redis: aioredis.Redis, owner: str) -> str:
    conversation_id = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(
            id=conversation_id, created_by_user_id=owner, sandbox_id="s" + secrets.token_hex(8)
        )
    )
    return conversation_id


async def _handshake(client: Any, query: str) -> int:
    """The status of a WebSocket handshake on the events socket (101 when accepted)."""
    try:
        ws = await client.ws_connect(f"{SOCKET}?{query}")
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    return 101


def sockets_logged(logs: LogCapture) -> int:
    return [r["route"] for r in logs.events("request")].count(SOCKET)


async def test_the_events_socket_takes_a_ticket_once_for_its_owner_only(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    alice_key = (await ApiKeyService(raw_redis, None).create("alice")).key
    bob_key = (await ApiKeyService(raw_redis, None).create("bob")).key
    alice, bob = {"X-Session-API-Key": alice_key}, {"X-Session-API-Key": bob_key}
    alices, bobs = await _conversation(raw_redis, "alice"), await _conversation(raw_redis, "bob")

    # Nobody without a key mints one; nobody mints one for someone else's conversation.
    resp = await client.post(TICKETS, json={"conversation_id": alices})
    assert resp.status == 401
    resp = await client.post(TICKETS, json={"conversation_id": alices}, headers=bob)
    assert resp.status == 404
    resp = await client.post(TICKETS, json={}, headers=alice)
    assert resp.status == 422

    with capture_logs("info") as logs:
        resp = await client.post(TICKETS, json={"conversation_id": alices}, headers=alice)
        assert resp.status == 201
        minted = await resp.json()
        ticket = minted["ticket"]
        assert 0 < minted["expires_in"] <= 30
        ttl = await raw_redis.ttl(keyspace.ws_ticket(hashlib.sha256(ticket.encode()).hexdigest()))
        assert 0 < ttl <= 30
        # Only its hash names a key.
        assert not [key for key in await raw_redis.keys("*") if ticket in text(key)]

        # Not for bob's conversation (and used up by trying), once for alice's.
        resp = await client.post(TICKETS, json={"conversation_id": bobs}, headers=bob)
        bobs_ticket = (await resp.json())["ticket"]
        assert await _handshake(client, f"conversation_id={alices}&acs_ticket={bobs_ticket}") == 401
        assert await _handshake(client, f"conversation_id={bobs}&acs_ticket={bobs_ticket}") == 401
        assert await _handshake(client, f"conversation_id={alices}&acs_ticket={ticket}") == 101
        assert await _handshake(client, f"conversation_id={alices}&acs_ticket={ticket}") == 401
        assert await _handshake(client, f"conversation_id={alices}&acs_ticket=wst_forged") == 401
        # The key in the query still works (OpenHands clients), and is never logged.
        assert (
            await _handshake(client, f"conversation_id={alices}&session_api_key={alice_key}") == 101
        )
        # A socket's request line is written when its handler ends, after the client closed.
        for _ in range(200):  # 10 s at most
            if sockets_logged(logs) >= 6:
                break
            await asyncio.sleep(0.05)
    assert sockets_logged(logs) == 6, logs.events("request")
    assert alice_key not in logs.text
    assert ticket not in logs.text
    assert bobs_ticket not in logs.text


@pytest.fixture
async def proxied_live(make_plain_live: LiveServerFactory) -> LiveServer:
    """The control plane over HTTP with the `proxied` spec (a second port) beside the default."""
    return await make_plain_live(specs={"proxied": PROXIED_SPEC}, reconcile_interval=1.0)


@pytest.mark.slow
@pytest.mark.usefixtures("sandbox_images")
async def test_the_proxy_websocket_takes_its_owners_ticket_once(
    proxied_live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    alice = Api(http, proxied_live.url, (await ApiKeyService(raw_redis, None).create("alice")).key)
    bob = Api(http, proxied_live.url, (await ApiKeyService(raw_redis, None).create("bob")).key)
    created = await alice.ok("POST", "/api/v1/sandboxes", json={"sandbox_spec_id": "proxied"})
    sid = created["id"]
    deadline = time.monotonic() + 120
    while (await alice.ok("GET", f"/api/v1/sandboxes/{sid}"))["status"] != "RUNNING":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await serve_app(docker_client, test_prefix, sid)
    socket = f"{proxied_live.url.replace('http', 'ws', 1)}/sandboxes/{sid}/proxy/WORKER_1/ws"

    async def opens(ticket: str) -> int:
        try:
            async with http.ws_connect(f"{socket}?acs_ticket={ticket}") as ws:
                await ws.send_str("hello")
                assert await ws.receive_str() == "HELLO"
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        return 101

    # Bob cannot mint one for alice's sandbox; a ticket of his own is not for it.
    assert (await bob.call("POST", TICKETS, json={"sandbox_id": sid}))[0] == 404
    bobs_sandbox = await bob.ok("POST", "/api/v1/sandboxes", json={})
    bobs = await bob.ok("POST", TICKETS, json={"sandbox_id": bobs_sandbox["id"]})
    assert await opens(bobs["ticket"]) == 401
    ticket = (await alice.ok("POST", TICKETS, json={"sandbox_id": sid}))["ticket"]
    deadline = time.monotonic() + 30  # the app in the sandbox starting
    while (status := await opens(ticket)) != 101:
        assert status == 502, status  # the app not listening yet: the ticket was used up
        assert time.monotonic() < deadline
        await asyncio.sleep(0.3)
        ticket = (await alice.ok("POST", TICKETS, json={"sandbox_id": sid}))["ticket"]
    assert await opens(ticket) == 401  # once only
