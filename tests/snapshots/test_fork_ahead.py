"""A fork starts its sandboxes on the base built beside its snapshot while the store is still
sealing that snapshot (SnapshotService.fork). All or nothing: a store that stops answering
after the forks started fails the fork with the store's 503 and takes the forks with it
(records, containers, workspaces, the base), the source untouched; and the sandboxes a control
plane that died meanwhile had started are withdrawn by the collector with the abandoned
snapshot. Real Docker, Redis and registry (through a relay that holds, then cuts, the upload)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import docker
from docker.errors import NotFound

from controlplane import keys
from controlplane.ids import uuid7_hex
from controlplane.snapshots.models import SnapshotRecord, SnapshotStatus
from controlplane.snapshots.store import SnapshotStore
from controlplane.store import keyspace
from drivers.docker import names as docker_names
from drivers.docker.bases import _image_name
from drivers.docker.helper import LABEL_OWNER
from tests.snapshots.test_snapshot_store import assert_nothing_orphaned
from tests.support.registry_server import RegistryServer
from tests.support.snapshot_helpers import container, fork_one, running, sh
from tests.support.tcp_relay import TcpRelay
from tests.support.types import Client, ClientFactory, UserHeaders


async def until(what: str, check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not {what} in {within} s"
        await asyncio.sleep(0.1)


async def listed(client: Client, headers: dict[str, str]) -> list[str]:
    page = await (await client.get("/api/v1/sandboxes/search", headers=headers)).json()
    return [s["id"] for s in page["items"]]


def exists(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> bool:
    try:
        container(docker_client, prefix, sandbox_id)
    except NotFound:
        return False
    return True


def leftovers(docker_client: docker.DockerClient, prefix: str, forks: list[str]) -> list[str]:
    """What is left on the engine of the forks and of their base."""
    left = [f"container {f}" for f in forks if exists(docker_client, prefix, f)]
    for fork in forks:
        name = docker_names.volume_name(prefix, fork)
        left += [f"volume {v.name}" for v in docker_client.volumes.list(filters={"name": name})]
    bases = docker_client.volumes.list(filters={"label": f"{LABEL_OWNER}={prefix}"})
    left += [f"base volume {v.name}" for v in bases]
    left += [f"image {i.tags}" for i in docker_client.images.list(name=_image_name(prefix))]
    return left


async def test_a_seal_that_fails_after_the_forks_started_takes_them_with_it(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    relay = await TcpRelay.started(registry.url)
    try:
        snap = await make_snap_client(snapshot_store_url=relay.url, snapshot_store_timeout=60)
        alice = await user_headers("alice")
        source = await running(snap, alice)
        await sh(
            docker_client,
            test_prefix,
            source["id"],
            "echo kept > /workspace/mark; head -c 3000000 /dev/urandom > /workspace/blob",
        )
        # The store takes the ping and the upload's start, then holds the pack's bytes: the
        # snapshot cannot be sealed, while its base (on the engine) can be built.
        relay.stall_after(64 * 1024)
        forking = asyncio.create_task(
            snap.post(f"/api/v1/sandboxes/{source['id']}/fork", json={"count": 3}, headers=alice)
        )

        async def forks_started() -> bool:
            ids = await listed(snap, alice)
            return len(ids) == 4 and all(exists(docker_client, test_prefix, i) for i in ids)

        await until("the forks' containers made", forks_started, within=120)
        assert relay.stalled.is_set()
        assert not forking.done()  # the fork answers once the snapshot is sealed
        forks = [i for i in await listed(snap, alice) if i != source["id"]]
        relay.cut()  # the store goes away in the middle of the snapshot's upload

        resp = await asyncio.wait_for(forking, 120)
        body = await resp.json()
        assert resp.status == 503, body
        assert "snapshot store" in body["detail"], body

        # Nothing of the forks is left: no record, no container, no workspace, no base.
        assert await listed(snap, alice) == [source["id"]]
        for fork in forks:
            gone = await snap.get(f"/api/v1/sandboxes/{fork}", headers=alice)
            assert gone.status == 404, await gone.text()
        assert leftovers(docker_client, test_prefix, forks) == []
        page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
        assert page["items"] == []
        assert await snap.app[keys.SNAPSHOT_DATA].store.forked_ahead() == []
        # The source as it was.
        state = container(docker_client, test_prefix, source["id"]).attrs["State"]
        assert state["Running"]
        assert not state["Paused"]
        status = await (await snap.get(f"/api/v1/sandboxes/{source['id']}", headers=alice)).json()
        assert status["status"] == "RUNNING"

        relay.restore()
        await assert_nothing_orphaned(snap, registry)
        fork, _ = await fork_one(snap, alice, source["id"])
        assert (await sh(docker_client, test_prefix, fork, "cat /workspace/mark")) == "kept\n"
    finally:
        await relay.close()


async def test_the_forks_of_an_abandoned_snapshot_are_withdrawn_by_the_collector(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    """What a control plane killed between the forks' start and the snapshot's listing leaves:
    a PENDING snapshot whose lease lapses and the sandboxes recorded against it. The collector
    abandons the one and deletes the others; the forks of a listed snapshot are only
    forgotten."""
    snap = await make_snap_client()
    alice = await user_headers("alice")
    store: SnapshotStore = snap.app[keys.SNAPSHOT_DATA].store
    data = snap.app[keys.SNAPSHOT_DATA]
    started = [await running(snap, alice) for _ in range(2)]
    orphans, kept = started[0]["id"], started[1]["id"]

    def pending(sandbox_id: str) -> SnapshotRecord:
        return SnapshotRecord(
            id=uuid7_hex(),
            owner="alice",
            sandbox_id=sandbox_id,
            spec_id="default",
            status=SnapshotStatus.PENDING,
            created_at=datetime.now(UTC),
            repository=data.repository("alice"),
        )

    dead = pending("sandbox-forked")
    await store.begin(dead, 0.01)  # its lease lapses at once: its replica died
    await store.note_forks(dead.id, [orphans])
    listed_one = pending("sandbox-forked-too")
    await store.begin(listed_one, 60)
    await store.fill(listed_one.id, store.encode(listed_one))
    # Noted while PENDING, then listed (its record READY): the collector only forgets them.
    assert await store.note_forks(listed_one.id, [kept])
    assert sorted(await store.forked_ahead()) == sorted([dead.id, listed_one.id])
    await snap.app[keys.REDIS].hset(keyspace.snapshot(listed_one.id), "status", "READY")
    await asyncio.sleep(0.05)

    done = await snap.app[keys.COLLECTOR].collect()
    assert done["abandoned"] == 1
    assert done["withdrawn"] == 1
    gone = await snap.get(f"/api/v1/sandboxes/{orphans}", headers=alice)
    assert gone.status == 404, await gone.text()
    assert not exists(docker_client, test_prefix, orphans)
    assert await listed(snap, alice) == [kept]
    assert exists(docker_client, test_prefix, kept)
    assert await store.forked_ahead() == []  # both forgotten


async def test_the_collector_finds_the_forks_ahead_without_scanning_the_keyspace(
    make_snap_client: ClientFactory,
) -> None:
    """The snapshots with forks started ahead come from their own index (one read), not from
    a SCAN of every key of the deployment at each collector pass; a record noted only while
    PENDING; the index forgets a snapshot once it is listed or its record is dropped, and one
    whose record expired (its TTL) at the next pass."""
    snap = await make_snap_client()
    redis = snap.app[keys.REDIS]
    store: SnapshotStore = snap.app[keys.SNAPSHOT_DATA].store
    data = snap.app[keys.SNAPSHOT_DATA]
    records = [
        SnapshotRecord(
            id=uuid7_hex(),
            owner="alice",
            sandbox_id=f"sandbox-{n}",
            spec_id="default",
            status=SnapshotStatus.PENDING,
            created_at=datetime.now(UTC),
            repository=data.repository("alice"),
        )
        for n in range(3)
    ]
    assert not await store.note_forks(records[0].id, ["sandbox-x"])  # no PENDING record
    for record in records:
        await store.begin(record, 60)
        await store.fill(record.id, store.encode(record))
        assert await store.note_forks(record.id, [f"fork-of-{record.sandbox_id}"])

    def scans(stats: dict[str, Any]) -> int:
        return int((stats.get("cmdstat_scan") or {}).get("calls", 0))

    before = scans(await redis.info("commandstats"))
    assert sorted(await store.forked_ahead()) == sorted(r.id for r in records)
    assert scans(await redis.info("commandstats")) == before

    await store.drop_forks(records[0].id)
    await redis.delete(keyspace.snapshot_forks(records[1].id))  # as its TTL does
    assert sorted(await store.forked_ahead()) == sorted(r.id for r in records[1:])
    await redis.hset(keyspace.snapshot(records[1].id), "status", "READY")
    await snap.app[keys.COLLECTOR].collect()
    # Still PENDING (its fork is under way): kept; the other dropped at the pass.
    assert await store.forked_ahead() == [records[2].id]
    assert await store.forks_of(records[2].id) == ["fork-of-sandbox-2"]
