"""The Docker export's edges: a snapshot given up while it holds the sandbox still (a checkpoint
that took longer than ACS_CHECKPOINT_CAPTURE_WAIT) leaves the sandbox running once the cancel
returns, and no freeze lands after it, so the user's message that goes next never meets a
frozen agent."""

from __future__ import annotations

import asyncio
import time

import docker

from controlplane import keys
from tests.support.snapshot_helpers import container, running, sh
from tests.support.types import Client, UserHeaders

MANY = "mkdir /workspace/many && cd /workspace/many && seq 1 6000 | xargs touch"
"""Files enough that the look under the freeze lasts a while (about 0.1 s per 1,000)."""


def paused(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> bool:
    return bool(container(docker_client, prefix, sandbox_id).attrs["State"]["Paused"])


async def test_a_snapshot_cancelled_while_it_freezes_leaves_the_sandbox_running(
    snap: Client,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    sandbox_id = source["id"]
    await sh(docker_client, test_prefix, sandbox_id, MANY)
    sandboxes = snap.app[keys.SANDBOXES].store
    snapshots = snap.app[keys.SNAPSHOTS]
    record = await sandboxes.get(sandbox_id)
    assert record is not None

    taking = snapshots.begin(record, "given up")
    # The hold is recorded just before the engine is asked to freeze: cancel from there on.
    deadline = time.monotonic() + 60
    while True:
        now = await sandboxes.get(sandbox_id)
        assert now is not None
        if now.held_until is not None:
            break
        assert not taking.done(), taking
        assert time.monotonic() < deadline, "the snapshot never began to freeze the sandbox"
        await asyncio.sleep(0.002)
    await snapshots.cancel(taking)

    assert not await asyncio.to_thread(paused, docker_client, test_prefix, sandbox_id)
    assert taking.cancelled()
    after = await sandboxes.get(sandbox_id)
    assert after is not None
    assert after.held_until is None
    # No freeze lands later either; the agent answers at once.
    await asyncio.sleep(1.0)
    assert not await asyncio.to_thread(paused, docker_client, test_prefix, sandbox_id)
    assert await sh(docker_client, test_prefix, sandbox_id, "echo alive") == "alive\n"
    listed = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert listed["items"] == []  # nothing half-taken is listed
