"""Hibernation on Docker: a sandbox paused longer than ACS_HIBERNATE_AFTER (or idle, with
ACS_IDLE_ACTION=hibernate) gives its memory back (its container stopped) and stays PAUSED; the
same resume brings it back with its files; admission counts only memory really held, so a host
full of hibernated sandboxes admits new ones."""

from __future__ import annotations

import asyncio
import time

import docker

from controlplane import keys
from controlplane.store import keyspace
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import container, running, sh
from tests.support.types import Client, ClientFactory, UserHeaders

MIB = 1024**2


async def hibernated(client: Client, headers: dict[str, str], sandbox_id: str) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = await (await client.get(f"/api/v1/sandboxes/{sandbox_id}", headers=headers)).json()
        if body["hibernated"]:
            return dict(body)
        await asyncio.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} did not hibernate: {body}")


async def pause(client: Client, headers: dict[str, str], sandbox_id: str) -> None:
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=headers)
    assert resp.status == 200, await resp.text()


async def test_a_long_paused_sandbox_gives_its_memory_back_and_resumes(
    make_sandbox_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    client = await make_sandbox_client(hibernate_after=1, reaper_interval=0.3)
    alice = await user_headers("alice")
    sandbox = await running(client, alice)
    await sh(docker_client, test_prefix, sandbox["id"], "echo kept > /workspace/mark")
    assert (
        await client.post(f"/api/v1/sandboxes/{sandbox['id']}/pause", headers=alice)
    ).status == 200

    body = await hibernated(client, alice, sandbox["id"])
    assert body["status"] == "PAUSED"  # to the API, a paused sandbox still
    state = container(docker_client, test_prefix, sandbox["id"]).attrs["State"]
    assert state["Status"] == "exited"  # no process, no memory
    reserved = await client.app[keys.REDIS].hexists(keyspace.MEMORY_RESERVED, sandbox["id"])
    assert not reserved

    resp = await client.post(f"/api/v1/sandboxes/{sandbox['id']}/resume", headers=alice)
    assert resp.status == 200
    back = await wait_status(client, alice, sandbox["id"], "RUNNING", within=90)
    assert back["hibernated"] is False
    assert await sh(docker_client, test_prefix, sandbox["id"], "cat /workspace/mark") == "kept\n"
    assert await client.app[keys.REDIS].hexists(keyspace.MEMORY_RESERVED, sandbox["id"])


async def test_a_host_full_of_hibernated_sandboxes_admits_new_ones(
    make_sandbox_client: ClientFactory, user_headers: UserHeaders
) -> None:
    # Room for two sandboxes' reservations (64 MiB each) on this "host".
    client = await make_sandbox_client(host_memory_bytes=130 * MIB, idle_action="hibernate")
    alice = await user_headers("alice")
    first, second = await running(client, alice), await running(client, alice)
    full = await client.post("/api/v1/sandboxes", json={}, headers=alice)
    assert full.status == 429, await full.text()
    # Paused (frozen) sandboxes keep their memory: still no room.
    for sandbox in (first, second):
        assert (
            await client.post(f"/api/v1/sandboxes/{sandbox['id']}/pause", headers=alice)
        ).status == 200
    assert (await client.post("/api/v1/sandboxes", json={}, headers=alice)).status == 429

    service = client.app[keys.SANDBOXES]
    for sandbox in (first, second):
        assert await service.hibernate_idle(sandbox["id"], "test")
    third = await running(client, alice)
    assert third["status"] == "RUNNING"
    # Waking one needs its memory again: the host is full with the new one and the other.
    await running(client, alice)
    again = await client.post(f"/api/v1/sandboxes/{first['id']}/resume", headers=alice)
    assert again.status == 429, await again.text()


async def test_the_idle_reaper_hibernates_when_told_to(
    make_sandbox_client: ClientFactory, user_headers: UserHeaders
) -> None:
    client = await make_sandbox_client(idle_action="hibernate", idle_timeout=1, reaper_interval=0.3)
    alice = await user_headers("alice")
    sandbox = await running(client, alice)
    body = await hibernated(client, alice, sandbox["id"])
    assert body["status"] == "PAUSED"
    assert "hibernated" in body["reason"]
