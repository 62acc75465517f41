"""Finding 5 of issue 26: a replica of the sandbox proxy that missed a re-create must never
forward to the sandbox's old container address, which on the shared bridge may be another
user's sandbox by then (and the proxy adds the sandbox's session key for the agent port).

Two real `controlplane serve` replicas on one Redis and one Docker engine: A re-creates alice's
sandbox (its container removed behind the control plane's back, then resumed: a new container)
while B has the old address cached. Before the resume a canary container takes the old address
on the deployment's bridge, standing for another user's sandbox that got it. First with B
hearing every change, then with B's Redis connections broken (a relay between B and Redis, cut
and restored) for the whole re-create, so that B's subscription re-connects having missed the
messages. Either way B's requests reach the new container and the canary hears nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from controlplane.auth.service import ApiKeyService
from drivers.docker import names as docker_names
from tests.support.live_server import Api, free_port
from tests.support.redis_server import RedisServer
from tests.support.sandbox_helpers import DEFAULT_IMAGE
from tests.support.serve_process import Serve, launch_serve, serve_env
from tests.support.tcp_relay import UnixRelay

pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.usefixtures("sandbox_images")]

# Another user's web server on the address the sandbox had: it prints what reaches it.
CANARY = r"""
import json, sys
from aiohttp import web

async def anything(request):
    print("CANARY " + json.dumps({"path": request.path, "headers": dict(request.headers)}),
          flush=True)
    return web.Response(text="canary")

app = web.Application()
app.router.add_route("*", "/{tail:.*}", anything)
web.run_app(app, host="0.0.0.0", port=8000, print=None)
"""


@dataclass
class Deployment:
    a: Api
    b: Api
    replicas: tuple[Serve, Serve]
    relay: UnixRelay


@pytest.fixture
async def deployment(
    tmp_path: Path, test_prefix: str, http: aiohttp.ClientSession
) -> AsyncIterator[Deployment]:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    relay = UnixRelay(str(redis_server.socket))
    await relay.start()
    env = serve_env(redis_server.url, test_prefix, tmp_path / "data")
    env.update(
        {
            "ACS_SECRET_KEY": Fernet.generate_key().decode(),
            "ACS_WEBHOOK_PORT": str(free_port()),
            "ACS_WARM_POOL": "0",
            "ACS_START_TIMEOUT": "90",
        }
    )
    # B reaches Redis through the relay, and waits out a cut rather than failing requests.
    env_b = env | {"ACS_REDIS_URL": relay.url, "ACS_REDIS_RETRY_WINDOW": "120"}
    servers: list[Serve] = []
    try:
        for environment in (env, env_b):
            server = await launch_serve(free_port(), environment)
            servers.append(server)
            await server.wait_healthy(http)
        setup = aioredis.Redis.from_url(redis_server.url)
        key = (await ApiKeyService(setup, None).create("alice")).key
        await setup.aclose()
        yield Deployment(
            a=Api(http, servers[0].url, key),
            b=Api(http, servers[1].url, key),
            replicas=(servers[0], servers[1]),
            relay=relay,
        )
    finally:
        for server in servers:
            await server.kill()
        await relay.close()
        redis_server.stop()


async def _status_is(api: Api, sandbox_id: str, status: str, within: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        sandbox = await api.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
        if sandbox["status"] == status:
            return dict(sandbox)
        assert time.monotonic() < deadline, sandbox
        await asyncio.sleep(0.2)


def _address(client: docker.DockerClient, prefix: str, sandbox_id: str) -> tuple[str, str]:
    """(network, address) of the sandbox's container."""
    container = client.containers.get(docker_names.container_name(prefix, sandbox_id))
    ((network, settings),) = container.attrs["NetworkSettings"]["Networks"].items()
    return network, settings["IPAddress"]


async def _recreate_behind_a(
    deployment: Deployment, client: docker.DockerClient, prefix: str, sandbox_id: str, n: int
) -> tuple[str, str, Any]:
    """Remove the container outside the control plane, let a canary take its address, resume
    the sandbox through A (a new container). Returns (old address, new address, canary)."""
    network, old = _address(client, prefix, sandbox_id)
    container = client.containers.get(docker_names.container_name(prefix, sandbox_id))
    await asyncio.to_thread(container.remove, force=True)
    await _status_is(deployment.a, sandbox_id, "MISSING")
    canary = await asyncio.to_thread(
        client.containers.create,
        DEFAULT_IMAGE,
        ["/opt/agent/bin/python", "-c", CANARY],
        name=f"{prefix}canary-{n}",
        user="1000",
    )
    await asyncio.to_thread(client.networks.get(network).connect, canary, ipv4_address=old)
    await asyncio.to_thread(client.networks.get("bridge").disconnect, canary)
    await asyncio.to_thread(canary.start)
    await deployment.a.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/resume")
    await _status_is(deployment.a, sandbox_id, "RUNNING")
    _, new = _address(client, prefix, sandbox_id)
    assert new != old
    return old, new, canary


async def _canary_answers(http: aiohttp.ClientSession, address: str) -> None:
    """The canary is really there: the control plane would reach it if it used the address."""
    deadline = time.monotonic() + 30
    while True:
        try:
            async with http.get(f"http://{address}:8000/ready-check") as resp:
                if await resp.text() == "canary":
                    return
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "the canary never answered"
        await asyncio.sleep(0.2)


def _heard(canary: Any) -> list[dict[str, Any]]:
    canary.reload()
    lines = canary.logs().decode(errors="replace").splitlines()
    return [json.loads(line[7:]) for line in lines if line.startswith("CANARY ")]


async def _b_reaches_the_new_container(
    deployment: Deployment, sandbox_id: str, canary: Any
) -> None:
    b = deployment.b
    health = f"{b.base}/sandboxes/{sandbox_id}/proxy/agent/health"
    # B may first refuse (409: its own engine watch saw the container go while Redis was out
    # of its reach) until its feed has re-read Redis; refusing is safe, forwarding is the
    # fault: never the canary's answer, and the new container's within a bound.
    deadline = time.monotonic() + 30
    while True:
        async with b.http.get(health, headers=b.headers) as resp:
            body = await resp.text()
        assert body != "canary", "replica B forwarded to the old address"
        if resp.status == 200:
            break
        assert resp.status == 409, body
        assert time.monotonic() < deadline, f"B still refuses after 30 s: {body}"
        await asyncio.sleep(0.1)
    for _ in range(20):
        async with b.http.get(health, headers=b.headers) as resp:
            body = await resp.text()
        assert resp.status == 200, body
        assert body != "canary", "replica B forwarded to the old address"
        await asyncio.sleep(0.05)
    heard = [h for h in _heard(canary) if h["path"] != "/ready-check"]
    assert heard == [], f"replica B forwarded to the old address: {heard}"


async def test_a_replica_never_forwards_to_an_address_a_recreate_freed(
    deployment: Deployment,
    docker_client: docker.DockerClient,
    test_prefix: str,
    http: aiohttp.ClientSession,
) -> None:
    created = await deployment.a.ok("POST", "/api/v1/sandboxes", json={})
    sandbox_id = created["id"]
    await _status_is(deployment.a, sandbox_id, "RUNNING")
    health = f"/sandboxes/{sandbox_id}/proxy/agent/health"

    # B hears every change: the re-create's messages reach it.
    assert (await deployment.b.call("GET", health))[0] == 200  # B caches the address
    old, _new, canary = await _recreate_behind_a(
        deployment, docker_client, test_prefix, sandbox_id, 1
    )
    await _canary_answers(http, old)
    await _b_reaches_the_new_container(deployment, sandbox_id, canary)

    # B's Redis connections break for the whole re-create, then come back: the messages of
    # the change were published while B's subscription was down.
    assert (await deployment.b.call("GET", health))[0] == 200  # B caches the new address
    deployment.relay.cut()
    try:
        old, _new, canary = await _recreate_behind_a(
            deployment, docker_client, test_prefix, sandbox_id, 2
        )
        await _canary_answers(http, old)
    finally:
        deployment.relay.restore()
    await _status_is(deployment.b, sandbox_id, "RUNNING", within=60)  # B reads Redis again
    await _b_reaches_the_new_container(deployment, sandbox_id, canary)
