"""`controlplane serve` killed with SIGKILL in the middle of a snapshot (while the sandbox is
frozen), of a fork's snapshot (while the forks' shared copy of its files is built beside it)
and of a fork (while the forks start), then started again: no half snapshot is listed, nothing
it sent stays in the store after a collection, the source sandbox is RUNNING and not left
frozen, the forks recorded finish starting, and a sweep removes what the engine was left."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest
import redis

from controlplane.store import keyspace, text
from drivers.docker.driver import DockerDriver
from tests.conftest import BOOTSTRAP_KEY
from tests.support.live_server import Api, free_port
from tests.support.registry_server import RegistryServer
from tests.support.serve_process import Serve, launch_serve, serve_env
from tests.support.snapshot_helpers import container, sh
from tests.support.tcp_relay import TcpRelay

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
CHURN = (
    "nohup sh -c 'while true; do head -c 20000000 /dev/urandom > /workspace/churn.tmp;"
    " mv /workspace/churn.tmp /workspace/churn; done' >/dev/null 2>&1 &"
)
"""Keeps a 20 MB file changing, so that every freeze copies it again: the freeze lasts long
enough for the kill to land inside it."""


class Server:
    """One `controlplane serve` at a time on a fixed port and data directory."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.process: Serve | None = None
        self.http: aiohttp.ClientSession | None = None

    async def start(self) -> Api:
        self.process = await launch_serve(self.port, self.env)
        assert self.http is not None
        await self.process.wait_healthy(self.http)
        return Api(self.http, self.process.url, BOOTSTRAP_KEY)

    async def kill(self) -> None:
        assert self.process is not None
        await self.process.kill()


@pytest.fixture
async def faulty_server(
    redis_url: str,
    test_prefix: str,
    tmp_path: Path,
    snapshot_settings: dict[str, Any],
    base_images: str,
) -> AsyncIterator[Server]:
    env = serve_env(redis_url, test_prefix, tmp_path / "data")
    env.update(
        {
            "ACS_SNAPSHOT_STORE_URL": snapshot_settings["snapshot_store_url"],
            "ACS_SNAPSHOT_STORE_REPOSITORY": snapshot_settings["snapshot_store_repository"],
            "ACS_SNAPSHOT_LEASE": "3",
            "ACS_SNAPSHOT_COLLECT_INTERVAL": "1",
            "ACS_SNAPSHOT_COLLECT_GRACE": "0",
            "ACS_SNAPSHOT_UPLOAD_SETTLE": "2",
            "ACS_WARM_POOL": "0",
            "ACS_MAX_RUNNING_PER_USER": "0",
        }
    )
    made = Server(env)
    async with aiohttp.ClientSession() as http:
        made.http = http
        try:
            yield made
        finally:
            if made.process is not None:
                await made.process.kill()


Check = Callable[[], Awaitable[bool]]


@pytest.fixture
def clean(redis_url: str, registry: RegistryServer, snapshot_repository: str) -> Check:
    """Whether the store is clean (store_is_clean) for this test's repository."""

    async def check() -> bool:
        return await asyncio.to_thread(store_is_clean, redis_url, registry, snapshot_repository)

    return check


async def until(what: str, check: Any, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not {what} in {within} s"
        await asyncio.sleep(0.2)


def redis_url_of(server: Server) -> str:
    return server.env["ACS_REDIS_URL"]


async def lock_lapsed(redis_url: str, sandbox_id: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:

        async def free() -> bool:
            return not await asyncio.to_thread(client.exists, keyspace.snapshot_lock(sandbox_id))

        await until("the snapshot lock lapsed", free, within=20)
    finally:
        client.close()


async def status_of(api: Api, sandbox_id: str) -> str:
    code, body = await api.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert code == 200, body
    return str(body["status"])


async def running(api: Api) -> str:
    code, body = await api.call("POST", "/api/v1/sandboxes", json={})
    assert code == 200, body

    async def up() -> bool:
        return await status_of(api, body["id"]) == "RUNNING"

    await until("RUNNING", up, within=90)
    return str(body["id"])


def store_is_clean(redis_url: str, registry: RegistryServer, repositories: str) -> bool:
    """Nothing pending, and the registry links exactly what READY snapshots use."""
    client = redis.Redis.from_url(redis_url)
    try:
        if client.zcard(keyspace.PENDING_SNAPSHOTS) or client.scard(keyspace.STORE_DELETIONS):
            return False
        used: set[str] = set()
        for key in client.scan_iter(match=keyspace.snapshot("*")):
            name = key.decode()
            if name.endswith(":uploads"):
                continue
            record = {text(k): text(v) for k, v in client.hgetall(name).items()}
            if record.get("status") == "READY":
                used.add(record["index_digest"])
                used.update(json.loads(record["packs"]))
        return registry.linked(repositories, "_layers") == used
    finally:
        client.close()


async def assert_swept(
    docker_client: docker.DockerClient, prefix: str, *, volumes: bool = False
) -> None:
    """A sweep of the snapshots' helpers (the collector's, for objects older than ten minutes;
    here at once) leaves none of the deployment's helper containers (and, `volumes`, none of
    its volumes) on the engine."""
    driver = DockerDriver(prefix=prefix)
    try:
        await driver.files.sweep(0)
        label: dict[str, str | list[str] | bool] = {"label": f"acs.files_prefix={prefix}"}
        assert docker_client.containers.list(all=True, filters=label) == []
        if volumes:
            assert docker_client.volumes.list(filters=label) == []
    finally:
        await driver.close()


async def test_killed_while_a_snapshot_holds_the_sandbox_still(
    faulty_server: Server, clean: Check, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    api = await faulty_server.start()
    sandbox_id = await running(api)
    await sh(docker_client, test_prefix, sandbox_id, "echo kept > /workspace/mark; " + CHURN)
    caught_frozen = False
    for _ in range(5):  # until the kill lands inside a freeze (it usually does the first time)
        await lock_lapsed(redis_url_of(faulty_server), sandbox_id)
        taking = asyncio.create_task(api.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots"))
        assert faulty_server.process is not None
        await faulty_server.process.wait_event("snapshot_freeze", within=60)
        await faulty_server.kill()
        await asyncio.gather(taking, return_exceptions=True)
        caught_frozen = container(docker_client, test_prefix, sandbox_id).attrs["State"]["Paused"]
        api = await faulty_server.start()
        if caught_frozen:
            break
    assert caught_frozen, "the kill never landed inside a freeze"

    async def thawed() -> bool:
        state = container(docker_client, test_prefix, sandbox_id).attrs["State"]
        return bool(state["Running"] and not state["Paused"])

    await until("thawed", thawed, within=20)
    assert await status_of(api, sandbox_id) == "RUNNING"
    code, page = await api.call("GET", "/api/v1/snapshots/search")
    assert code == 200
    assert page["items"] == []  # no half snapshot listed

    await until("collected", clean, within=30)
    assert (await sh(docker_client, test_prefix, sandbox_id, "cat /workspace/mark")) == "kept\n"
    # The dead replica's one-at-a-time lock lapses (15 s), then snapshots go on.
    await lock_lapsed(redis_url_of(faulty_server), sandbox_id)
    code, taken = await api.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots")
    assert code == 200, taken


async def test_killed_while_forks_are_restored(
    faulty_server: Server, clean: Check, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    api = await faulty_server.start()
    source = await running(api)
    await sh(
        docker_client,
        test_prefix,
        source,
        "echo kept > /workspace/mark; head -c 30000000 /dev/urandom > /workspace/big",
    )
    forking = asyncio.create_task(
        api.call("POST", f"/api/v1/sandboxes/{source}/fork", json={"count": 3})
    )
    assert faulty_server.process is not None
    # The forks are recorded and their starts begin (their files are the snapshot's copy,
    # built on this engine while the snapshot was taken).
    await faulty_server.process.wait_event("sandbox_forked", within=90)
    await faulty_server.kill()
    await asyncio.gather(forking, return_exceptions=True)
    api = await faulty_server.start()

    page = await api.ok("GET", "/api/v1/sandboxes/search")
    forks = [s["id"] for s in page["items"] if s["id"] != source]
    assert len(forks) == 3  # recorded before the kill: their starts are carried on

    async def all_running() -> bool:
        return all([await status_of(api, f) == "RUNNING" for f in forks])

    await until("forks RUNNING", all_running, within=180)
    for fork in forks:
        assert (await sh(docker_client, test_prefix, fork, "cat /workspace/mark")) == "kept\n"
    assert await status_of(api, source) == "RUNNING"
    assert not container(docker_client, test_prefix, source).attrs["State"]["Paused"]

    await until("collected", clean, within=30)
    # What the killed restore left on the engine goes with a sweep (the collector's runs one
    # every pass for objects older than ten minutes; here at once).
    await assert_swept(docker_client, test_prefix)


@pytest.mark.parametrize(
    "moment",
    [
        # The base's volume made, the export's helper staging its copies in it (before the
        # build takes it), and the build itself under way.
        "snapshot_base_prepared",
        "snapshot_base_building",
    ],
)
async def test_killed_while_a_forks_copy_is_built(
    faulty_server: Server,
    clean: Check,
    docker_client: docker.DockerClient,
    test_prefix: str,
    moment: str,
) -> None:
    api = await faulty_server.start()
    source = await running(api)
    await sh(
        docker_client,
        test_prefix,
        source,
        "echo kept > /workspace/mark; head -c 30000000 /dev/urandom > /workspace/big",
    )
    forking = asyncio.create_task(
        api.call("POST", f"/api/v1/sandboxes/{source}/fork", json={"count": 3})
    )
    assert faulty_server.process is not None
    # The base the forks would share is being made from the snapshot's export.
    await faulty_server.process.wait_event(moment, within=90)
    await faulty_server.kill()
    await asyncio.gather(forking, return_exceptions=True)
    api = await faulty_server.start()

    # The snapshot was never committed: nothing listed, no fork recorded, the source as it was.
    code, page = await api.call("GET", "/api/v1/snapshots/search")
    assert code == 200
    assert page["items"] == []
    sandboxes = await api.ok("GET", "/api/v1/sandboxes/search")
    assert [s["id"] for s in sandboxes["items"]] == [source]
    assert await status_of(api, source) == "RUNNING"
    assert not container(docker_client, test_prefix, source).attrs["State"]["Paused"]
    await until("collected", clean, within=30)

    # The half-built base (its volume, the container its image was to be committed from) goes
    # with a sweep; then a fork succeeds.
    await assert_swept(docker_client, test_prefix, volumes=True)
    await lock_lapsed(redis_url_of(faulty_server), source)
    code, forked = await api.call("POST", f"/api/v1/sandboxes/{source}/fork", json={"count": 1})
    assert code == 200, forked
    (fork,) = [s["id"] for s in forked["sandboxes"]]

    async def fork_running() -> bool:
        return await status_of(api, fork) == "RUNNING"

    await until("fork RUNNING", fork_running, within=120)
    assert (await sh(docker_client, test_prefix, fork, "cat /workspace/mark")) == "kept\n"


async def test_killed_after_the_forks_started_before_their_snapshot_is_stored(
    faulty_server: Server,
    clean: Check,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    """The forks start on their base while the store seals the snapshot: killed then (the
    store holding the snapshot's upload), the snapshot is never listed, and the collector of
    the next control plane withdraws the forks with it: no fork left, the source as it was."""
    relay = await TcpRelay.started(registry.url)
    try:
        faulty_server.env["ACS_SNAPSHOT_STORE_URL"] = relay.url
        api = await faulty_server.start()
        source = await running(api)
        await sh(
            docker_client,
            test_prefix,
            source,
            "echo kept > /workspace/mark; head -c 3000000 /dev/urandom > /workspace/big",
        )
        relay.stall_after(64 * 1024)  # the snapshot's pack is held: it cannot be sealed
        forking = asyncio.create_task(
            api.call("POST", f"/api/v1/sandboxes/{source}/fork", json={"count": 3})
        )

        async def forks_recorded() -> bool:
            page = await api.ok("GET", "/api/v1/sandboxes/search")
            return len(page["items"]) == 4

        await until("the forks recorded", forks_recorded, within=90)
        assert relay.stalled.is_set()
        await faulty_server.kill()
        await asyncio.gather(forking, return_exceptions=True)
        relay.cut()  # what it held goes nowhere
        relay.restore()
        api = await faulty_server.start()

        async def withdrawn() -> bool:
            page = await api.ok("GET", "/api/v1/sandboxes/search")
            return [s["id"] for s in page["items"]] == [source]

        await until("the forks withdrawn", withdrawn, within=60)
        code, page = await api.call("GET", "/api/v1/snapshots/search")
        assert code == 200
        assert page["items"] == []
        assert await status_of(api, source) == "RUNNING"
        assert not container(docker_client, test_prefix, source).attrs["State"]["Paused"]
        assert (await sh(docker_client, test_prefix, source, "cat /workspace/mark")) == "kept\n"
        await until("collected", clean, within=30)
        sandboxes = docker_client.containers.list(
            all=True, filters={"label": f"acs.prefix={test_prefix}"}
        )
        assert [c.name for c in sandboxes] == [f"{test_prefix}{source}"]
        # What the killed export left on the engine (its helper, holding the forks' base) goes
        # with a sweep (the collector's, for objects older than ten minutes; here at once).
        await assert_swept(docker_client, test_prefix)
    finally:
        await relay.close()
