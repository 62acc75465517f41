"""The store's rules on real Redis, Docker and registry: quotas (429), retention, collection
(nothing the registry links that no snapshot uses, after a pass), one copy of identical content
per user, a corrupted blob refused by its digest, a store that is down or lost in the middle of
an upload (503, no sandbox touched, nothing left behind)."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker

from controlplane import keys
from controlplane.ids import uuid7_hex
from controlplane.snapshots.models import SnapshotRecord, SnapshotStatus
from controlplane.snapshots.registry import digest_of
from controlplane.snapshots.store import SnapshotStore
from controlplane.store import keyspace, text
from tests.support.registry_server import RegistryServer
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import container, running, sh, snapshot
from tests.support.tcp_relay import TcpRelay
from tests.support.types import Client, ClientFactory, UserHeaders

SAME = (
    'python3 -c "import random; '
    "open('/workspace/same.bin','wb').write(random.Random(7).randbytes(3000000))\""
)


def random_file(path: str, size: int) -> str:
    return f"head -c {size} /dev/urandom > {path}"


async def referenced(client: Client) -> tuple[set[str], set[str]]:
    """Blobs and manifests the READY snapshots use."""
    store: SnapshotStore = client.app[keys.SNAPSHOT_DATA].store
    redis = client.app[keys.REDIS]
    blobs: set[str] = set()
    manifests: set[str] = set()
    for key in await redis.keys(keyspace.snapshot("*")):
        if text(key).endswith(":uploads"):
            continue
        record = await store.get(text(key).rsplit(":", 1)[1])
        if record is not None and record.status == "READY":
            blobs |= {record.index_digest, *record.packs}
            manifests.add(record.manifest_digest)
    return blobs, manifests


def assert_running(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> None:
    """The sandbox's container runs, not left frozen."""
    state = container(docker_client, prefix, sandbox_id).attrs["State"]
    assert state["Running"]
    assert not state["Paused"]


async def assert_nothing_orphaned(client: Client, registry: RegistryServer) -> None:
    """After collection the registry links exactly what READY snapshots use: passes run until
    no deletion is left (what an abandoned snapshot was sending and the store said it did not
    hold is asked again until it has settled: ACS_SNAPSHOT_UPLOAD_SETTLE, short here)."""
    store: SnapshotStore = client.app[keys.SNAPSHOT_DATA].store
    deadline = time.monotonic() + 30
    await client.app[keys.COLLECTOR].collect()
    while await store.deletions():
        assert time.monotonic() < deadline, f"deletions left: {await store.deletions()}"
        await asyncio.sleep(0.2)
        await client.app[keys.COLLECTOR].collect()
    blobs, manifests = await referenced(client)
    repositories = client.app[keys.CONFIG].snapshot_store_repository
    assert registry.linked(repositories, "_layers") == blobs
    assert registry.linked(repositories, "_manifests") == manifests


async def test_quotas_are_429s_and_leave_nothing_behind(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    snap = await make_snap_client(snapshot_max_per_user=2, snapshot_max_bytes_per_user=2_500_000)
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await snapshot(snap, alice, source["id"])
    await sh(docker_client, test_prefix, source["id"], random_file("/workspace/big", 3_000_000))
    over = await snap.post(f"/api/v1/sandboxes/{source['id']}/snapshots", headers=alice)
    assert over.status == 429, await over.text()
    assert "per-user limit" in (await over.json())["detail"]
    assert over.headers["Retry-After"]
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert len(page["items"]) == 1
    await assert_nothing_orphaned(snap, registry)

    await sh(docker_client, test_prefix, source["id"], "rm /workspace/big")
    await snapshot(snap, alice, source["id"])
    again = await snap.post(f"/api/v1/sandboxes/{source['id']}/snapshots", headers=alice)
    assert again.status == 429  # the count this time
    # Never a half-frozen sandbox: it answers after every refusal.
    assert container(docker_client, test_prefix, source["id"]).attrs["State"]["Paused"] is False


async def test_retention_keeps_named_and_last_and_collects_the_rest(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    snap = await make_snap_client(snapshot_keep_last=1, snapshot_orphan_retention=0)
    alice = await user_headers("alice")
    source = await running(snap, alice)
    taken: list[dict[str, Any]] = []
    for n, name in enumerate(["kept", None, None]):
        await sh(
            docker_client,
            test_prefix,
            source["id"],
            random_file(f"/workspace/f{n}", 300_000),
        )
        taken.append(await snapshot(snap, alice, source["id"], name=name))
    await assert_nothing_orphaned(snap, registry)
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert [s["id"] for s in page["items"]] == [taken[2]["id"], taken[0]["id"]]

    # The sandbox goes: its unnamed snapshots go at the next pass (orphan retention 0), the
    # named one stays, and restores.
    assert (await snap.delete(f"/api/v1/sandboxes/{source['id']}", headers=alice)).status == 200
    await assert_nothing_orphaned(snap, registry)
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert [s["id"] for s in page["items"]] == [taken[0]["id"]]
    restored = await running(snap, alice, snapshot_id=taken[0]["id"])
    await sh(docker_client, test_prefix, restored["id"], "test -s /workspace/f0")


async def test_identical_content_is_stored_once_per_user(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    first, second, bobs = (
        (await running(snap, h) for h in (alice, alice, bob))
        if False
        else (await running(snap, alice), await running(snap, alice), await running(snap, bob))
    )
    for sandbox in (first, second, bobs):
        await sh(docker_client, test_prefix, sandbox["id"], SAME)
    one = await snapshot(snap, alice, first["id"])
    two = await snapshot(snap, alice, second["id"])
    theirs = await snapshot(snap, bob, bobs["id"])
    assert one["stored_bytes"] > 3_000_000
    assert two["stored_bytes"] < 300_000, two  # alice's copy is there already
    assert theirs["stored_bytes"] > 3_000_000  # bob's keys differ: nothing shared with alice


async def test_a_corrupted_blob_is_refused_by_its_digest(
    snap: Client,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], random_file("/workspace/x", 2_000_000))
    taken = await snapshot(snap, alice, source["id"])
    record = await snap.app[keys.SNAPSHOT_DATA].store.get(taken["id"])
    assert record is not None
    pack = max(record.packs, key=lambda d: blob_path(registry, d).stat().st_size)
    path = blob_path(registry, pack)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    resp = await snap.post("/api/v1/sandboxes", json={"snapshot_id": taken["id"]}, headers=alice)
    assert resp.status == 200
    failed = await wait_status(snap, alice, (await resp.json())["id"], "ERROR", within=90)
    assert f"blob {pack}" in failed["reason"]
    assert "does not match its digest" in failed["reason"]


def blob_path(registry: RegistryServer, digest: str) -> Path:
    hexa = digest.split(":")[1]
    return registry.storage / f"docker/registry/v2/blobs/sha256/{hexa[:2]}/{hexa}/data"


async def test_a_store_that_is_down_is_a_503_and_touches_no_sandbox(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    tmp_path: Path,
) -> None:
    own = RegistryServer(tmp_path / "registry")
    own.start()
    try:
        snap = await make_snap_client(snapshot_store_url=own.url, snapshot_store_timeout=5)
        alice = await user_headers("alice")
        source = await running(snap, alice)
        taken = await snapshot(snap, alice, source["id"])
        own.stop()

        down = await snap.post(f"/api/v1/sandboxes/{source['id']}/snapshots", headers=alice)
        assert down.status == 503, await down.text()
        assert "does not answer" in (await down.json())["detail"]
        assert_running(docker_client, test_prefix, source["id"])
        body = await (await snap.get(f"/api/v1/sandboxes/{source['id']}", headers=alice)).json()
        assert body["status"] == "RUNNING"
        restore = await snap.post(
            "/api/v1/sandboxes", json={"snapshot_id": taken["id"]}, headers=alice
        )
        assert restore.status == 503, await restore.text()
        listed = await (await snap.get("/api/v1/sandboxes/search", headers=alice)).json()
        assert [s["id"] for s in listed["items"]] == [source["id"]]

        own.start()
        await snapshot(snap, alice, source["id"])
    finally:
        own.stop()


async def test_a_store_lost_in_the_middle_of_a_pack_leaves_nothing(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    """The store going away in the middle of a checkpoint's packs (one sent, the next cut
    half-way) is a 503 that lists nothing, leaves the sandbox running and leaves nothing in
    the store once collected; the next snapshot is taken as usual."""
    relay = await TcpRelay.started(registry.url)
    try:
        snap = await make_snap_client(snapshot_store_url=relay.url, snapshot_store_timeout=5)
        alice = await user_headers("alice")
        source = await running(snap, alice)
        first = await snapshot(snap, alice, source["id"])
        # 24 MB of new bytes: a full pack (16 MiB) sent while the files are read, then the
        # rest, cut in the middle.
        await sh(docker_client, test_prefix, source["id"], random_file("/workspace/b", 24_000_000))
        relay.cut_after(20_000_000)

        lost = await snap.post(f"/api/v1/sandboxes/{source['id']}/snapshots", headers=alice)
        assert lost.status == 503, await lost.text()
        assert_running(docker_client, test_prefix, source["id"])
        listed = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
        assert [s["id"] for s in listed["items"]] == [first["id"]]

        relay.restore()
        await assert_nothing_orphaned(snap, registry)
        taken = await snapshot(snap, alice, source["id"])
        assert taken["stored_bytes"] >= 24_000_000
        await assert_nothing_orphaned(snap, registry)
    finally:
        await relay.close()


async def test_an_upload_that_lands_after_its_snapshot_was_abandoned_is_collected(
    make_snap_client: ClientFactory, registry: RegistryServer
) -> None:
    """A blob whose bytes the store had when its sender gave up (the connection cut after the
    body, a cancel) can be linked after the collector's delete found nothing (a race seen under
    load in the test above): until it has settled, a "not there" is asked again at the next
    pass, which deletes it once it landed; past the settle, a "not there" is final."""
    snap = await make_snap_client(snapshot_upload_settle=60.0)
    data = snap.app[keys.SNAPSHOT_DATA]
    store: SnapshotStore = data.store
    collector = snap.app[keys.COLLECTOR]
    # The passes are this test's own: the app's loop makes one as it starts, which under load
    # could land between the late upload and the check that it landed.
    await collector.stop()
    repositories = snap.app[keys.CONFIG].snapshot_store_repository

    async def abandoned(blob: bytes, settle: float) -> tuple[str, str]:
        record = SnapshotRecord(
            id=uuid7_hex(),
            owner="alice",
            sandbox_id="sandbox-of-alice",
            spec_id="default",
            status=SnapshotStatus.PENDING,
            created_at=datetime.now(UTC),
            repository=data.repository("alice"),
        )
        await store.begin(record, 30)
        digest = digest_of(blob)
        await store.uploading(record.id, "blob", digest)  # recorded, then sent: in flight
        await store.abandon(record, settle)
        return record.repository, digest

    late = os.urandom(4096)
    repository, digest = await abandoned(late, 60.0)
    await collector.collect()  # the store does not hold it yet: not final
    assert (repository, "blob", digest) in await store.deletions()
    await data.registry.put_blob(repository, late)  # the upload lands after that delete
    assert digest in registry.linked(repositories)
    await collector.collect()
    assert digest not in registry.linked(repositories)
    assert await store.deletions() == []

    never = os.urandom(4096)
    repository, digest = await abandoned(never, 0.0)  # settled at once: "not there" is final
    await collector.collect()
    assert await store.deletions() == []
    assert await store.settling() == {}
