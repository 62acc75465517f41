"""The per-user running cap: 429 with Retry-After, nothing made, atomic under concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane import keys
from tests.support.sandbox_helpers import OwnDocker, start, start_running, wait_status
from tests.support.types import Client, ClientFactory, UserHeaders


async def post_start(client: Client, headers: dict[str, str]) -> tuple[int, Any, Any]:
    resp = await client.post("/api/v1/sandboxes", json={}, headers=headers)
    return resp.status, await resp.json(), resp.headers


def assert_quota(status: int, body: Any, headers: Any, user: str, cap: int) -> None:
    assert status == 429, body
    assert headers["Retry-After"] == "30"
    assert body == {
        "detail": f"user {user} already has {cap} sandboxes starting or running (the per-user "
        "limit); pause or delete one, then retry"
    }


async def ids_of(client: Client, headers: dict[str, str]) -> list[str]:
    resp = await client.get("/api/v1/sandboxes/search", headers=headers)
    assert resp.status == 200
    return [item["id"] for item in (await resp.json())["items"]]


async def test_cap_refuses_a_third_start_and_a_resume_over_the_cap(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory(max_running_per_user=2)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    first = (await start(sbx, alice))["id"]
    second = (await start(sbx, alice))["id"]

    # STARTING already counts: the third is refused before either is up.
    assert_quota(*await post_start(sbx, alice), "alice", 2)
    await wait_status(sbx, alice, first, "RUNNING")
    await wait_status(sbx, alice, second, "RUNNING")
    assert_quota(*await post_start(sbx, alice), "alice", 2)
    assert sorted(await ids_of(sbx, alice)) == sorted([first, second])
    assert len(own_docker.containers()) == 2
    assert await sbx.app[keys.SANDBOXES].store.count_active("alice") == 2

    # The cap is per user.
    other = (await start(sbx, bob))["id"]

    resp = await sbx.post(f"/api/v1/sandboxes/{first}/pause", headers=alice)
    assert resp.status == 200
    third = (await start_running(sbx, alice))["id"]

    # Resuming the paused one would make three: refused, and it stays PAUSED and frozen.
    resp = await sbx.post(f"/api/v1/sandboxes/{first}/resume", headers=alice)
    assert_quota(resp.status, await resp.json(), resp.headers, "alice", 2)
    paused = await wait_status(sbx, alice, first, "PAUSED", within=1)
    assert paused["reason"] is None
    (container,) = [c for c in own_docker.containers() if first in c.name]
    assert container.status == "paused"

    # Deleting one frees a slot for the resume.
    resp = await sbx.delete(f"/api/v1/sandboxes/{second}", headers=alice)
    assert resp.status == 200
    resp = await sbx.post(f"/api/v1/sandboxes/{first}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(sbx, alice, first, "RUNNING", within=10)
    assert sorted(await ids_of(sbx, alice)) == sorted([first, third])
    await wait_status(sbx, bob, other, "RUNNING")
    assert len(own_docker.containers()) == 3


async def test_error_and_missing_do_not_count(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory(max_running_per_user=1)
    alice = await user_headers("alice")
    first = (await start_running(sbx, alice))["id"]
    (container,) = own_docker.containers()
    container.remove(force=True)
    await wait_status(sbx, alice, first, "MISSING", within=15)
    await start_running(sbx, alice)  # a second one
    # Re-creating the MISSING one would make two.
    resp = await sbx.post(f"/api/v1/sandboxes/{first}/resume", headers=alice)
    assert resp.status == 429
    await wait_status(sbx, alice, first, "MISSING", within=1)


async def test_concurrent_starts_respect_the_cap_atomically(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory(max_running_per_user=5)
    alice = await user_headers("alice")
    results = await asyncio.gather(*(post_start(sbx, alice) for _ in range(5)))
    assert [status for status, _, _ in results] == [200] * 5, results
    ids = [body["id"] for _, body, _ in results]
    assert len(set(ids)) == 5
    running = [await wait_status(sbx, alice, i, "RUNNING", within=60) for i in ids]
    ports = [u["port"] for r in running for u in r["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    assert len(ports) == 5
    assert len(set(ports)) == 5, ports
    keys_seen = {r["session_api_key"] for r in running}
    assert len(keys_seen) == 5
    assert None not in keys_seen
    assert_quota(*await post_start(sbx, alice), "alice", 5)

    # The same Redis behind a control plane restarted with a higher cap: 5 active, room for 1.
    await sbx.close()
    sbx = await sbx_factory(max_running_per_user=6)
    for i in ids:
        await wait_status(sbx, alice, i, "RUNNING", within=5)
    results = await asyncio.gather(*(post_start(sbx, alice) for _ in range(3)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 429, 429], results
    for status, body, headers in results:
        if status == 429:
            assert_quota(status, body, headers, "alice", 6)
    (winner,) = [body["id"] for status, body, _ in results if status == 200]
    await wait_status(sbx, alice, winner, "RUNNING", within=60)
    assert sorted(await ids_of(sbx, alice)) == sorted([*ids, winner])
    assert len(own_docker.containers()) == 6
    assert await sbx.app[keys.SANDBOXES].store.count_active("alice") == 6
