"""Recovery: control-plane restarts, interrupted starts, orphans, tombstones, engine outages."""

from __future__ import annotations

import asyncio
import gc
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.crypto import hash_api_key
from controlplane.errors import RuntimeUnavailable
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import Limits
from controlplane.store import keyspace
from drivers.docker import names as docker_names
from tests.support.sandbox_helpers import DEFAULT_IMAGE as IMAGE
from tests.support.sandbox_helpers import OwnDocker, start_running, wait_status
from tests.support.types import ClientFactory, UserHeaders

DOCKER_SOCK = "/var/run/docker.sock"


async def agent_echo(running: dict[str, Any], text: str) -> str:
    (url,) = [u["url"] for u in running["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/api/bash/execute_bash_command",
            json={"command": f"echo {text}", "timeout": 10},
            headers={"X-Session-API-Key": running["session_api_key"]},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return str(result["stdout"]).strip()


async def poll(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {within}s")


def fake_container(
    docker_client: docker.DockerClient,
    prefix: str,
    sandbox_id: str,
    env: dict[str, str],
) -> Any:
    """A container that looks like one of ours (labels, name, volume), made behind our back."""
    return docker_client.containers.run(
        IMAGE,
        ["sleep", "300"],
        name=docker_names.container_name(prefix, sandbox_id),
        labels=docker_names.labels(prefix, sandbox_id, "alice", "default"),
        environment=env,
        volumes={
            docker_names.volume_name(prefix, sandbox_id): {"bind": "/workspace", "mode": "rw"}
        },
        detach=True,
    )


# -- restarts -----------------------------------------------------------------------------------


async def test_restart_keeps_running_sandboxes(
    sbx_factory: ClientFactory, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    first = await sbx_factory()
    running = await start_running(first, alice)
    sandbox_id = running["id"]
    assert await agent_echo(running, "before") == "before"
    await first.close()

    second = await sbx_factory()
    # A full sweep of the new process finds nothing to change.
    assert await second.app[keys.RECONCILER].sweep() == 0
    again = await wait_status(second, alice, sandbox_id, "RUNNING", within=1)
    assert again["session_api_key"] == running["session_api_key"]
    assert again["exposed_urls"] == running["exposed_urls"]
    assert again["reason"] is None
    assert await agent_echo(again, "after") == "after"
    assert second.app[keys.RECONCILER].fixes == 0
    resp = await second.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    assert resp.status == 200
    await wait_status(second, alice, sandbox_id, "PAUSED", within=1)


async def test_a_listing_older_than_the_record_does_not_make_it_missing(
    sbx_factory: ClientFactory, user_headers: UserHeaders
) -> None:
    # A sweep lists the runtime, then reads the records: a sandbox re-created by another
    # replica in between is absent from the listing but RUNNING in its record. Applied as is,
    # that stale "gone" turned a healthy sandbox MISSING (seen in CI, under load).
    alice = await user_headers("alice")
    client = await sbx_factory()
    running = await start_running(client, alice)
    sandbox_id = running["id"]
    reconciler = client.app[keys.RECONCILER]
    before = reconciler.fixes
    await reconciler._apply(sandbox_id, None)  # the listing's stale view: no container
    again = await wait_status(client, alice, sandbox_id, "RUNNING", within=1)
    assert again["reason"] is None
    assert reconciler.fixes == before
    assert await agent_echo(again, "still here") == "still here"


async def test_interrupted_start_with_a_healthy_agent_becomes_running(
    sbx_factory: ClientFactory, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    first = await sbx_factory()
    running = await start_running(first, alice)
    sandbox_id = running["id"]
    await first.close()

    second = await sbx_factory()
    service = second.app[keys.SANDBOXES]
    record = await service.store.get(sandbox_id)
    assert record is not None
    before = second.app[keys.RECONCILER].fixes
    # As if the old process died between "container up" and "agent healthy".
    result = await service.store.transition(record, [SandboxStatus.RUNNING], SandboxStatus.STARTING)
    assert result.outcome == "ok"
    assert not service.is_launching(sandbox_id)
    again = await wait_status(second, alice, sandbox_id, "RUNNING", within=10)
    assert second.app[keys.RECONCILER].fixes > before
    assert again["session_api_key"] == running["session_api_key"]
    assert again["exposed_urls"] == running["exposed_urls"]
    assert await agent_echo(again, "ok") == "ok"
    assert await service.store.count_active("alice") == 1


async def test_interrupted_start_without_container_is_taken_over_and_finished(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    """A start recorded (STARTING) by a process that died before making anything: the sweep
    takes it over and creates the container; the change is an automatic lifecycle event."""
    alice = await user_headers("alice")
    client = await sbx_factory(start_timeout=20)
    store = client.app[keys.SANDBOXES].store
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    record = SandboxRecord(
        id=naming.new_sandbox_id(),
        owner="alice",
        spec_id="default",
        status=SandboxStatus.STARTING,
        session_api_key=secrets.token_urlsafe(16),
        created_at=long_ago,
        updated_at=long_ago,
        last_activity_at=long_ago,
    )
    assert await store.create(record, 0, Limits()) == "ok"
    assert await store.count_active("alice") == 1
    running = await wait_status(client, alice, record.id, "RUNNING", within=30)
    assert running["session_api_key"] == record.session_api_key
    assert await agent_echo(running, "finished") == "finished"
    assert [c.name for c in own_docker.containers()] == [
        docker_names.container_name(own_docker.prefix, record.id)
    ]
    events = await (await client.get("/api/v1/lifecycle-events/search", headers=alice)).json()
    taken = [e for e in events["items"] if e["sandbox_id"] == record.id]
    assert [(e["type"], e["automatic"]) for e in taken] == [("sandbox.running", True)], taken


async def test_a_delete_cut_off_is_finished_not_turned_into_missing(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    first = await sbx_factory()
    sandbox_id = (await start_running(first, alice))["id"]
    await first.close()
    second = await sbx_factory()
    service = second.app[keys.SANDBOXES]
    # As if a process recorded the delete, removed the container, then died.
    assert await service.store.mark_deleting(sandbox_id)
    own_docker.container(sandbox_id).remove(force=True)

    async def gone() -> bool:
        return (await second.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 404

    await poll(gone, 10, "the delete was not finished")
    assert own_docker.containers() == []
    assert own_docker.volumes() == []
    events = await (await second.get("/api/v1/lifecycle-events/search", headers=alice)).json()
    kinds = [(e["type"], e["automatic"]) for e in events["items"] if e["sandbox_id"] == sandbox_id]
    assert kinds[0] == ("sandbox.deleted", True), kinds
    assert ("sandbox.missing", True) not in kinds


async def test_a_sandbox_in_error_resumes_on_its_kept_workspace(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    client = await sbx_factory()
    service = client.app[keys.SANDBOXES]
    running = await start_running(client, alice)
    sandbox_id = running["id"]
    container = own_docker.container(sandbox_id)
    assert container.exec_run(["sh", "-c", "echo kept > /workspace/note"]).exit_code == 0
    # An ERROR from an earlier failure, with the container gone.
    record = await service.store.get(sandbox_id)
    assert record is not None
    result = await service.store.transition(
        record, [SandboxStatus.RUNNING], SandboxStatus.ERROR, reason="an earlier failure"
    )
    assert result.outcome == "ok"
    container.remove(force=True)

    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    again = await wait_status(client, alice, sandbox_id, "RUNNING")
    assert again["session_api_key"] == running["session_api_key"]
    assert again["reason"] is None
    assert await agent_echo(again, "$(cat /workspace/note)") == "kept"


# -- orphans and tombstones ---------------------------------------------------------------------


async def test_container_without_record_is_adopted(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    client = await sbx_factory()
    running = await start_running(client, alice)
    sandbox_id = running["id"]
    key = running["session_api_key"]

    # Lose the record as a Redis without persistence would, with no tombstone.
    async with raw_redis.pipeline(transaction=True) as pipe:
        pipe.delete(keyspace.sandbox(sandbox_id))
        pipe.zrem(keyspace.ALL_SANDBOXES, sandbox_id)
        pipe.zrem(keyspace.user_sandboxes("alice"), sandbox_id)
        pipe.srem(keyspace.user_active_sandboxes("alice"), sandbox_id)
        pipe.delete(keyspace.sandbox_by_key(hash_api_key(key)))
        await pipe.execute()
    assert not await raw_redis.exists(keyspace.sandbox_tombstone(sandbox_id))

    adopted = await wait_status(client, alice, sandbox_id, "RUNNING", within=10)
    assert "adopted" in adopted["reason"]
    assert adopted["created_by_user_id"] == "alice"
    assert adopted["sandbox_spec_id"] == "default"
    assert adopted["session_api_key"] == key
    assert adopted["exposed_urls"] == running["exposed_urls"]
    (container,) = own_docker.containers()
    assert (
        abs(
            datetime.fromisoformat(adopted["created_at"]).timestamp()
            - datetime.fromisoformat(container.attrs["Created"][:26] + "+00:00").timestamp()
        )
        < 1
    )
    # Every index is back: search, the running cap, the session-key lookup.
    resp = await client.get("/api/v1/sandboxes/search", headers=alice)
    assert [i["id"] for i in (await resp.json())["items"]] == [sandbox_id]
    store = client.app[keys.SANDBOXES].store
    assert await store.count_active("alice") == 1
    assert await store.id_for_key(key) == sandbox_id
    assert await agent_echo(adopted, "adopted") == "adopted"

    # An adopted sandbox is a normal one: it can be deleted, and stays deleted.
    resp = await client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 200
    assert own_docker.containers() == []


async def test_deleted_sandbox_container_is_removed_never_adopted(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    client = await sbx_factory()
    running = await start_running(client, alice)
    sandbox_id = running["id"]
    resp = await client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 200
    assert await raw_redis.exists(keyspace.sandbox_tombstone(sandbox_id))
    assert own_docker.containers() == []

    # Its container shows up again (a launch elsewhere that finished after the delete).
    env = {"OH_SESSION_API_KEYS_0": running["session_api_key"]}
    fake_container(own_docker.client, own_docker.prefix, sandbox_id, env)
    reconciler = client.app[keys.RECONCILER]

    async def gone() -> bool:
        resp = await client.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
        assert resp.status == 404, await resp.text()
        return not own_docker.containers() and not own_docker.volumes()

    await poll(gone, within=10, what="the deleted sandbox's container was not removed")
    assert await reconciler.sweep() == 0
    assert await client.app[keys.SANDBOXES].store.get(sandbox_id) is None
    resp = await client.get("/api/v1/sandboxes/search", headers=alice)
    assert (await resp.json())["items"] == []


async def test_labelled_container_without_session_key_is_removed(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    client = await sbx_factory()
    sandbox_id = naming.new_sandbox_id()
    fake_container(own_docker.client, own_docker.prefix, sandbox_id, env={})

    async def removed() -> bool:
        return not own_docker.containers()

    await poll(removed, within=10, what="the keyless container was not removed")
    resp = await client.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 404


# -- the Docker engine going away ---------------------------------------------------------------


class DockerProxy:
    """A unix socket that forwards to the real engine, and can be stopped and started again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def stop(self) -> None:
        """Stop listening and cut every open connection, as an engine restart does."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
        await asyncio.sleep(0)  # let the aborted transports close their sockets

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(DOCKER_SOCK)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._writers |= pair
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        finally:
            for w in pair:
                w.transport.abort()
            self._writers -= pair

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        finally:
            dst.transport.abort()  # one side ended: end the other, as a socket would


@pytest.fixture
async def docker_proxy() -> AsyncIterator[DockerProxy]:
    # Short path: unix socket paths are limited to about 100 characters.
    directory = Path(tempfile.mkdtemp(prefix="acs-dp-", dir="/tmp"))
    proxy = DockerProxy(directory / "docker.sock")
    await proxy.start()
    yield proxy
    if proxy._server is not None:
        await proxy.stop()
    shutil.rmtree(directory, ignore_errors=True)
    # docker-py does not close a unix socket whose connect() was refused; collect those now,
    # under this test's warning filter, rather than in whichever test the GC happens to run.
    gc.collect()


async def expect_503(resp: aiohttp.ClientResponse) -> str:
    body = await resp.json()
    assert resp.status == 503, body
    assert resp.content_type == "application/json"
    assert set(body) == {"detail"}
    detail: str = body["detail"]
    assert detail.startswith("Docker engine unreachable"), detail
    return detail


# docker-py leaks the socket of a refused connect (docker/transport/unixconn.py); the GC closes it.
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
async def test_engine_outage_is_503_then_recovers_without_restart(
    docker_proxy: DockerProxy,  # first, so that it outlives the app
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    client = await sbx_factory(docker_url=f"unix://{docker_proxy.path}")
    running = await start_running(client, alice)
    sandbox_id = running["id"]
    assert docker_proxy.connections > 0, "the app did not talk to Docker through the proxy"

    await docker_proxy.stop()
    started = time.monotonic()
    await expect_503(await client.post("/api/v1/sandboxes", json={}, headers=alice))
    await expect_503(await client.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice))
    assert time.monotonic() - started < 5, "an unreachable engine must fail fast"
    # Nothing recorded for the refused start; the sandbox keeps its status through sweeps.
    resp = await client.get("/api/v1/sandboxes/search", headers=alice)
    assert [i["id"] for i in (await resp.json())["items"]] == [sandbox_id]
    reconciler = client.app[keys.RECONCILER]
    with pytest.raises(RuntimeUnavailable):
        await reconciler.sweep()
    same = await wait_status(client, alice, sandbox_id, "RUNNING", within=1)
    assert same["session_api_key"] == running["session_api_key"]
    assert same["reason"] is None
    (container,) = own_docker.containers()
    assert container.status == "running", "the failed pause must not have paused it"
    assert await client.app[keys.SANDBOXES].store.count_active("alice") == 1

    await docker_proxy.start()
    # The very first engine call after the outage works: no stale pooled connection.
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(client, alice, sandbox_id, "PAUSED", within=1)
    container.reload()
    assert container.status == "paused"
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(client, alice, sandbox_id, "RUNNING", within=10)
    assert await reconciler.sweep() == 0
    second = (await start_running(client, alice))["id"]
    resp = await client.delete(f"/api/v1/sandboxes/{second}", headers=alice)
    assert resp.status == 200
    assert [c.name for c in own_docker.containers()] == [
        docker_names.container_name(own_docker.prefix, sandbox_id)
    ]


@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
async def test_engine_down_at_start_up_then_up(
    docker_proxy: DockerProxy,
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
) -> None:
    alice = await user_headers("alice")
    await docker_proxy.stop()
    client = await sbx_factory(docker_url=f"unix://{docker_proxy.path}")
    reconciler = client.app[keys.RECONCILER]
    with pytest.raises(RuntimeUnavailable):
        await reconciler.sweep()
    await expect_503(await client.post("/api/v1/sandboxes", json={}, headers=alice))
    resp = await client.get("/api/v1/sandboxes/search", headers=alice)
    assert (await resp.json())["items"] == []

    await docker_proxy.start()
    assert await reconciler.sweep() == 0
    running = await start_running(client, alice)
    assert await agent_echo(running, "up") == "up"
