"""Redis going away and coming back while the app keeps running."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from tests.support.redis_server import RedisServer
from tests.support.types import Client


async def _expect_503(client: Client, method: str, path: str, **kwargs: Any) -> None:
    started = time.monotonic()
    response = await client.request(method, path, **kwargs)
    elapsed = time.monotonic() - started
    assert response.status == 503, (method, path, await response.text())
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == {"detail"}
    assert "Redis" in body["detail"]
    assert "X-Request-ID" in response.headers
    assert elapsed < 5, f"{method} {path} took {elapsed:.1f}s with Redis down"


async def test_requests_fail_fast_while_redis_is_down_and_recover(
    own_redis: RedisServer,
    make_client: Callable[..., Any],
    admin_headers: dict[str, str],
) -> None:
    # Each answer while Redis is down comes after the retry window (ACS_REDIS_RETRY_WINDOW, 2 s
    # by default); 0.5 s here: the five refusals below are the same wait five times, and
    # _expect_503's 5 s bound still tells a bounded wait from a hang.
    client: Client = await make_client(redis_url=own_redis.url, redis_retry_window=0.5)
    setup = aioredis.Redis.from_url(own_redis.url)
    user = {"X-Session-API-Key": (await ApiKeyService(setup, None).create("dora")).key}
    await setup.aclose()

    response = await client.post(
        "/api/settings", headers=user, json={"language": "pt", "llm_api_key": "kept-key"}
    )
    assert response.status == 200
    body = {"name": "SURVIVES", "value": "outage"}
    assert (await client.post("/api/secrets", headers=user, json=body)).status == 201
    assert (await client.get("/ready")).status == 200

    own_redis.stop()

    # A user key needs Redis to be checked; the bootstrap key does not, its data does.
    await _expect_503(client, "GET", "/api/settings", headers=user)
    await _expect_503(client, "GET", "/api/settings", headers=admin_headers)
    await _expect_503(client, "POST", "/api/settings", headers=user, json={"language": "x"})
    await _expect_503(client, "GET", "/api/secrets", headers=user)
    await _expect_503(client, "DELETE", "/api/secrets/SURVIVES", headers=user)
    # Liveness does not depend on Redis; readiness reports it.
    assert (await client.get("/health")).status == 200
    response = await client.get("/ready")
    assert response.status == 503
    assert await response.json() == {
        "status": "degraded",
        "redis": False,
        "runtime": None,
        "driver": None,
    }

    own_redis.start()  # same directory and socket; the AOF brings the data back

    response = await client.get("/api/settings", headers=user)
    assert response.status == 200
    settings = await response.json()
    assert settings["language"] == "pt"
    assert settings["llm_api_key_set"] is True
    response = await client.get("/api/secrets", headers=user)
    assert await response.json() == {"custom_secrets": [{"name": "SURVIVES", "description": None}]}
    response = await client.post("/api/settings", headers=user, json={"language": "es"})
    assert response.status == 200
    assert (await (await client.get("/api/settings", headers=user)).json())["language"] == "es"
    assert (await client.get("/ready")).status == 200


async def test_a_frozen_redis_is_a_bounded_503_not_a_hang(
    own_redis: RedisServer,
    make_client: Callable[..., Any],
    admin_headers: dict[str, str],
) -> None:
    """A Redis that accepts connections but never answers: the socket timeout bounds the wait.

    redis-py retries the command and, inside that, the connect+handshake, so the worst case is
    about 9 x redis_timeout (3 command attempts x 3 connect attempts); it is bounded, not fast.
    """
    timeout = 0.5
    client: Client = await make_client(redis_url=own_redis.url, redis_timeout=timeout)
    assert (await client.get("/api/settings", headers=admin_headers)).status == 200
    assert own_redis.process is not None
    own_redis.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = await client.get("/api/settings", headers=admin_headers)
        elapsed = time.monotonic() - started
        assert response.status == 503
        assert "Redis" in (await response.json())["detail"]
        assert elapsed < 12 * timeout, f"took {elapsed:.1f}s"
    finally:
        own_redis.process.send_signal(signal.SIGCONT)

    response = await client.get("/api/settings", headers=admin_headers)
    assert response.status == 200
