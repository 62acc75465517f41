"""Per-API-key rate limit (shared in Redis) and the request time limit (504)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import WSMsgType, web

from controlplane.api import ratelimit
from controlplane.app import create_app
from controlplane.config import ServiceConfig
from controlplane.store import keyspace
from tests.support.types import Client, ClientFactory, UserHeaders

STATE: web.AppKey[dict[str, Any]] = web.AppKey("test_state")


def key_id(headers: dict[str, str]) -> str:
    return headers["X-Session-API-Key"].split("_")[1]


async def secret_names(client: Client, headers: dict[str, str]) -> set[str]:
    response = await client.get("/api/secrets", headers=headers)
    assert response.status == 200
    body = await response.json()
    return {item["name"] for item in body["custom_secrets"]}


async def test_over_the_limit_is_429_with_retry_after_and_nothing_is_lost(
    make_client: ClientFactory, user_headers: UserHeaders, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(rate_limit_per_minute=5)
    alice = await user_headers("alice")
    for i in range(5):
        response = await client.post(
            "/api/secrets", json={"name": f"S{i}", "value": f"v{i}"}, headers=alice
        )
        assert response.status == 201, await response.text()
        assert response.headers["X-RateLimit-Limit"] == "5"
        assert response.headers["X-RateLimit-Remaining"] == str(4 - i)

    refused = await client.post("/api/secrets", json={"name": "S5", "value": "v5"}, headers=alice)
    assert refused.status == 429
    assert refused.content_type == "application/json"
    body = await refused.json()
    assert set(body) == {"detail"}
    assert "rate limit of 5 requests per minute" in body["detail"]
    retry_after = int(refused.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    ttl_ms = await raw_redis.pttl(keyspace.rate_limit(key_id(alice)))
    assert 0 < ttl_ms <= 60_000
    assert retry_after == -(-ttl_ms // 1000) or retry_after == -(-ttl_ms // 1000) + 1
    # Reads are limited too.
    assert (await client.get("/api/secrets", headers=alice)).status == 429

    # Another key, even of the same user, has its own window; and every write made under the
    # limit is there, the refused one is not.
    second_key = await user_headers("alice")
    assert await secret_names(client, second_key) == {f"S{i}" for i in range(5)}
    bob = await user_headers("bob")
    assert (await client.get("/api/settings", headers=bob)).status == 200

    # Public routes are never limited, whatever key comes with them.
    for _ in range(10):
        assert (await client.get("/health", headers=alice)).status == 200
        assert (await client.get("/api/openapi.json", headers=alice)).status == 200
    # Still limited: refusals do not extend or reset the window.
    assert (await client.get("/api/settings", headers=alice)).status == 429
    assert await raw_redis.pttl(keyspace.rate_limit(key_id(alice))) <= ttl_ms


async def test_the_window_resets(
    make_client: ClientFactory, user_headers: UserHeaders, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit, "WINDOW_MS", 1000)
    client = await make_client(rate_limit_per_minute=2)
    alice = await user_headers("alice")
    for _ in range(2):
        assert (await client.get("/api/settings", headers=alice)).status == 200
    refused = await client.get("/api/settings", headers=alice)
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    await asyncio.sleep(1.1)
    response = await client.get("/api/settings", headers=alice)
    assert response.status == 200
    assert response.headers["X-RateLimit-Remaining"] == "1"


async def test_the_limit_is_shared_by_replicas_and_exact_under_concurrency(
    make_client: ClientFactory, user_headers: UserHeaders
) -> None:
    first = await make_client(rate_limit_per_minute=10)
    second = await make_client(rate_limit_per_minute=10)
    alice = await user_headers("alice")
    for _ in range(3):
        assert (await first.get("/api/settings", headers=alice)).status == 200
        assert (await second.get("/api/settings", headers=alice)).status == 200
    responses = await asyncio.gather(
        *(c.get("/api/settings", headers=alice) for c in (first, second) * 10)
    )
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 4 + [429] * 16


async def test_the_bootstrap_key_is_limited_like_any_key(
    make_client: ClientFactory, admin_headers: dict[str, str]
) -> None:
    client = await make_client(rate_limit_per_minute=3)
    statuses = [(await client.get("/api/settings", headers=admin_headers)).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


async def test_zero_turns_the_limit_off(
    make_client: ClientFactory, user_headers: UserHeaders, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(rate_limit_per_minute=0)
    alice = await user_headers("alice")
    for _ in range(30):
        response = await client.get("/api/settings", headers=alice)
        assert response.status == 200
        assert "X-RateLimit-Limit" not in response.headers
    assert await raw_redis.exists(keyspace.rate_limit(key_id(alice))) == 0


async def test_unauthenticated_requests_are_not_counted(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(rate_limit_per_minute=1)
    for _ in range(5):
        assert (await client.get("/api/settings")).status == 401
        bad = {"X-Session-API-Key": "acs_0123456789ab_nope"}
        assert (await client.get("/api/settings", headers=bad)).status == 401
    assert [k async for k in raw_redis.scan_iter(match="acs:ratelimit:*")] == []


# -- request time limit ------------------------------------------------------------------------


@pytest.fixture
def slow_app(
    make_config: Callable[..., ServiceConfig],
) -> Callable[..., web.Application]:
    """The real app plus test-only routes, added before it starts (like /boom in test_errors)."""

    def make(**overrides: Any) -> web.Application:
        app = create_app(make_config(**overrides), with_sandboxes=False)
        state: dict[str, Any] = {"cancelled": False}

        async def slow(_request: web.Request) -> web.Response:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise
            return web.json_response({"late": True})

        async def own_timeout(_request: web.Request) -> web.Response:
            raise TimeoutError("an upstream call of the handler timed out")

        async def stream(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b"[1")
            await asyncio.sleep(0.5)
            await response.write(b",2]")
            await response.write_eof()
            return response

        async def socket(request: web.Request) -> web.StreamResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                await asyncio.sleep(0.5)
                await ws.send_str(f"echo {message.data}")
            return ws

        app.router.add_get("/test/slow", slow)
        app.router.add_get("/test/own-timeout", own_timeout)
        app.router.add_get("/test/stream", stream)
        app.router.add_get("/test/socket", socket)
        app[STATE] = state
        return app

    return make


async def test_a_slow_handler_is_cancelled_with_504_json(
    aiohttp_client: Any, slow_app: Callable[..., web.Application], admin_headers: dict[str, str]
) -> None:
    app = slow_app(request_timeout=0.2)
    client: Client = await aiohttp_client(app)
    started = time.monotonic()
    response = await client.get("/test/slow", headers=admin_headers)
    elapsed = time.monotonic() - started
    assert response.status == 504
    assert response.content_type == "application/json"
    assert await response.json() == {"detail": "request took longer than 0.2 s"}
    assert response.headers["X-Request-ID"]
    assert 0.2 <= elapsed < 2
    assert app[STATE]["cancelled"] is True
    # The app is fine afterwards, and fast requests are not affected.
    assert (await client.get("/api/settings", headers=admin_headers)).status == 200


async def test_a_handlers_own_timeout_is_not_a_504(
    aiohttp_client: Any, slow_app: Callable[..., web.Application], admin_headers: dict[str, str]
) -> None:
    client: Client = await aiohttp_client(slow_app(request_timeout=5))
    response = await client.get("/test/own-timeout", headers=admin_headers)
    # Passed on to the error middleware as it is (which maps OSError and its subclasses, such
    # as TimeoutError, to 503), not reported as the request time limit.
    assert response.status != 504
    assert "took longer" not in (await response.json())["detail"]


async def test_streams_and_websockets_outlive_the_time_limit(
    aiohttp_client: Any, slow_app: Callable[..., web.Application], admin_headers: dict[str, str]
) -> None:
    client: Client = await aiohttp_client(slow_app(request_timeout=0.2))
    response = await client.get("/test/stream", headers=admin_headers)
    assert response.status == 200
    assert await response.json() == [1, 2]

    async with client.ws_connect("/test/socket", headers=admin_headers) as ws:
        for i in range(2):
            await ws.send_str(f"m{i}")
            message = await ws.receive(timeout=5)
            assert message.type == WSMsgType.TEXT
            assert message.data == f"echo m{i}"
