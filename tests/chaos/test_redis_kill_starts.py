"""Redis killed (SIGKILL) and restarted while a dozen starts are in flight: every start the
control plane acknowledged still ends RUNNING, none ends ERROR, and no task exception is left
unretrieved. The control plane runs as a real process on a Redis of this test alone (AOF, fsync
on every write), so the suite's shared Redis is not disturbed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import BOOTSTRAP_KEY
from tests.support.live_server import Api, free_port
from tests.support.redis_server import RedisServer
from tests.support.serve_process import Serve, launch_serve, serve_env

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

STARTS = 12
OUTAGE = 3.0  # seconds without Redis; below ACS_START_TIMEOUT, so no start may give up


@pytest.fixture
def durable_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this test alone that fsyncs every write before it answers: a SIGKILL
    loses nothing acknowledged."""
    server = RedisServer(tmp_path_factory.mktemp("redis-kill"), fsync_always=True)
    server.start()
    yield server
    server.stop()


async def test_redis_killed_during_concurrent_creates_fails_no_start(
    durable_redis: RedisServer, test_prefix: str, tmp_path: Path
) -> None:
    env = serve_env(durable_redis.url, test_prefix, tmp_path / "data")
    # A dozen agent servers booting at once on a 2-core host the rest of the suite loads too:
    # CI saw them take past the default 60 s. The outage, not the boot time, is under test.
    env.update({"ACS_MAX_RUNNING_PER_USER": "0", "ACS_WARM_POOL": "0", "ACS_START_TIMEOUT": "180"})
    server: Serve = await launch_serve(free_port(), env)
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_healthy(http)
            api = Api(http, server.url, BOOTSTRAP_KEY)
            created = await asyncio.gather(
                *(api.ok("POST", "/api/v1/sandboxes", json={}) for _ in range(STARTS))
            )
            ids = [body["id"] for body in created]
            assert all(body["status"] == "STARTING" for body in created)

            durable_redis.kill()
            await asyncio.sleep(OUTAGE)
            durable_redis.start()  # same socket and directory: the AOF brings every record back

            statuses = await _settle(api, ids, within=200)
            assert statuses == dict.fromkeys(ids, "RUNNING"), statuses
            events = await api.ok("GET", "/api/v1/lifecycle-events/search?all_users=true&limit=100")
            errors = [e for e in events["items"] if e["type"] == "sandbox.error"]
            assert errors == []
            running = {e["sandbox_id"] for e in events["items"] if e["type"] == "sandbox.running"}
            assert running == set(ids)
    finally:
        await server.kill()
    logs = "\n".join(server.lines)
    assert "Task exception was never retrieved" not in logs
    # The outage did hit calls in flight: the Redis client retried through it (for up to
    # ACS_REDIS_RETRY_WINDOW), or a launch retried past it.
    assert "redis_retrying" in logs or "sandbox_start_retry" in logs


async def _settle(api: Api, ids: list[str], within: float) -> dict[str, str]:
    """Statuses once none is STARTING (or at the deadline); a 503 while Redis is back to
    loading its AOF counts as not settled yet."""
    deadline = time.monotonic() + within
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        for sandbox_id in ids:
            code, body = await api.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
            statuses[sandbox_id] = body["status"] if code == 200 else f"HTTP {code}"
            if code == 200 and body.get("reason"):
                statuses[sandbox_id] += f" ({body['reason']})"  # why, when it failed
        if all(s not in ("STARTING", "HTTP 503") for s in statuses.values()):
            break
        await asyncio.sleep(0.5)
    return statuses
