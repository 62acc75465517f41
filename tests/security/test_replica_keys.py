"""Finding 6 of issue 26: replicas of one deployment must encrypt with one key. A replica started
with another ACS_SECRET_KEY, or with none (it would make its own key file), would write records
the others cannot decrypt, and its sandbox tokens and session cookies would fail on them: it
refuses to start, naming the setting. Real `controlplane serve` processes on one Redis."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from controlplane.store import keyspace
from tests.support.live_server import free_port
from tests.support.redis_server import RedisServer
from tests.support.serve_process import Serve, launch_serve, serve_env

pytestmark = [pytest.mark.ha, pytest.mark.slow]


async def _refused(server: Serve) -> str:
    """The output of a replica that must exit at start-up with a configuration error."""
    try:
        code, _took = await server.exited(time.monotonic())
    finally:
        await server.kill()
    output = "\n".join(server.lines)
    assert code == 2, f"the replica did not refuse to start (exit {code}):\n{server.logs()}"
    return output


async def test_a_replica_with_another_key_refuses_to_start(
    own_redis: RedisServer, test_prefix: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    key = Fernet.generate_key().decode()
    base = serve_env(own_redis.url, test_prefix, tmp_path / "first") | {
        "ACS_WEBHOOK_PORT": str(free_port()),
        "ACS_WARM_POOL": "0",
    }
    first = await launch_serve(free_port(), base | {"ACS_SECRET_KEY": key})
    try:
        await first.wait_healthy(http, within=60)

        # Another ACS_SECRET_KEY: the error names the setting.
        other_key = Fernet.generate_key().decode()
        other = await launch_serve(free_port(), base | {"ACS_SECRET_KEY": other_key})
        output = await _refused(other)
        assert "configuration error: ACS_SECRET_KEY" in output
        assert "is not the one this deployment's data was written with" in output
        assert other_key not in output
        assert key not in output

        # No ACS_SECRET_KEY: a key file of its own in its data dir, named in the error.
        env = {k: v for k, v in base.items() if k != "ACS_SECRET_KEY"}
        env["ACS_DATA_DIR"] = str(tmp_path / "third")
        third = await launch_serve(free_port(), env)
        output = await _refused(third)
        assert f"the key file {tmp_path / 'third' / 'secret.key'}" in output

        # The deployment's key: it starts and serves.
        fourth = await launch_serve(free_port(), base | {"ACS_SECRET_KEY": key})
        try:
            await fourth.wait_healthy(http, within=60)
        finally:
            await fourth.kill()
    finally:
        await first.kill()

    # What Redis holds says nothing of the key.
    client = aioredis.Redis.from_url(own_redis.url)
    try:
        check = await client.get(keyspace.SECRET_KEY_CHECK)
    finally:
        await client.aclose()
    assert check is not None
    assert len(check) == 64
    assert key.encode() not in check
