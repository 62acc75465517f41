"""Attacks on snapshots from where attackers stand: another user's key (their snapshot ids,
their sandboxes: a 404, never a 403, and nothing of theirs restored or listed), and whoever
reads the store (the registry's disk): no workspace content, session key or gateway token in
the clear there."""

from __future__ import annotations

import docker

from tests.support.registry_server import RegistryServer
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import running, sh, snapshot
from tests.support.types import Client, UserHeaders

MARKER = "acs-secret-marker-7f3a9c"


async def test_another_users_snapshots_and_sandboxes_are_not_found(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], f"echo {MARKER} > /workspace/secret")
    taken = await snapshot(snap, alice, source["id"])
    snapshot_url = f"/api/v1/snapshots/{taken['id']}"

    assert (await snap.get(snapshot_url, headers=bob)).status == 404
    assert (await snap.delete(snapshot_url, headers=bob)).status == 404
    page = await (await snap.get("/api/v1/snapshots/search", headers=bob)).json()
    assert page["items"] == []
    by_sandbox = await snap.get(f"/api/v1/snapshots/search?sandbox_id={source['id']}", headers=bob)
    assert (await by_sandbox.json())["items"] == []
    # Restoring it as bob: the same 404 as an id that never was; nothing is started.
    resp = await snap.post("/api/v1/sandboxes", json={"snapshot_id": taken["id"]}, headers=bob)
    assert resp.status == 404, await resp.text()
    mine = await (await snap.get("/api/v1/sandboxes/search", headers=bob)).json()
    assert mine["items"] == []
    # Alice's sandbox, snapshotted or forked by bob: not found.
    for action in ("snapshots", "fork"):
        resp = await snap.post(f"/api/v1/sandboxes/{source['id']}/{action}", headers=bob)
        assert resp.status == 404, await resp.text()
    # And alice still has it all.
    assert (await snap.get(snapshot_url, headers=alice)).status == 200


async def test_the_store_holds_nothing_in_the_clear(
    snap: Client,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    registry: RegistryServer,
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    # What a workspace may hold: the agent's environment (its session key, its webhook URL),
    # a secret of the user's, repeated so that compression cannot hide it either.
    await sh(
        docker_client,
        test_prefix,
        source["id"],
        f"env > /workspace/env.txt; for i in $(seq 200); do echo {MARKER}; done > /workspace/s",
    )
    await snapshot(snap, alice, source["id"])
    forked = await snap.post(f"/api/v1/sandboxes/{source['id']}/fork", headers=alice)
    assert forked.status == 200
    needles = [MARKER.encode(), source["session_api_key"].encode(), b"acsgw."]
    for blob in registry.blob_paths():
        data = blob.read_bytes()
        for needle in needles:
            assert needle not in data, f"{needle!r} in the clear in {blob}"
    # The fork got a key of its own: the source's key is not in its environment.
    fork_id = (await forked.json())["sandboxes"][0]["id"]
    await wait_status(snap, alice, fork_id, "RUNNING", within=90)
    env = await sh(docker_client, test_prefix, fork_id, "env")
    assert source["session_api_key"] not in env
