"""The Docker export's edges: a snapshot given up while it holds the sandbox still (a checkpoint
that took longer than ACS_CHECKPOINT_CAPTURE_WAIT) leaves the sandbox running once the cancel
returns, and no freeze lands after it, so the user's message that goes next never meets a
frozen agent; a large file streams to the control plane in pieces, never held whole; of the
state tree, a conversation's fork gets only that conversation's history, under its new id."""

from __future__ import annotations

import asyncio
import hashlib
import time
import tracemalloc

import docker
import pytest

from controlplane import keys
from controlplane.snapshots.reader import Carried
from drivers.base import STATE, FileEntry, FileKind
from drivers.docker.driver import DockerDriver
from tests.support.snapshot_helpers import container, running, sh
from tests.support.types import Client, UserHeaders

MANY = "mkdir /workspace/many && cd /workspace/many && seq 1 1500 | xargs touch"
"""Files enough that the look under the freeze lasts a moment (about 0.1 s per 1,000)."""


def paused(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> bool:
    return bool(container(docker_client, prefix, sandbox_id).attrs["State"]["Paused"])


@pytest.fixture
async def alices(snap: Client, user_headers: UserHeaders) -> tuple[dict[str, str], str]:
    """Alice's headers and a RUNNING sandbox of hers."""
    alice = await user_headers("alice")
    return alice, (await running(snap, alice))["id"]


async def test_a_snapshot_cancelled_while_it_freezes_leaves_the_sandbox_running(
    snap: Client,
    alices: tuple[dict[str, str], str],
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    alice, sandbox_id = alices
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


class _Unrecorded:
    """The export's Hold, with no record to keep (the control plane's is the taker's)."""

    async def begin(self) -> None:
        return None

    async def end(self) -> None:
        return None


async def test_a_large_file_streams_in_pieces(
    snap: Client,
    alices: tuple[dict[str, str], str],
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    _, sandbox_id = alices
    size = 64 << 20
    await sh(
        docker_client, test_prefix, sandbox_id, f"head -c {size} /dev/urandom > /workspace/big"
    )
    expected = (await sh(docker_client, test_prefix, sandbox_id, "sha256sum /workspace/big"))[:64]
    driver = snap.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)

    digest = hashlib.sha256()
    got = 0
    inside = False
    tracemalloc.start()
    try:
        export = driver.files.export(
            sandbox_id, {}, working_dir="/workspace", state_paths=(), hold=_Unrecorded()
        )
        async with export as files:
            async for item in files.items:
                if isinstance(item, FileEntry):
                    inside = item.kind == FileKind.FILE and item.path == "big"
                elif inside:
                    digest.update(item)
                    got += len(item)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == size
    assert digest.hexdigest() == expected
    assert peak < size // 2, f"{peak} bytes held at once for a {size}-byte file"


def test_a_fork_carries_only_the_conversations_history_under_its_new_id() -> None:
    root = "var/lib/acs-agent/conversations"
    source, new, other = "a" * 32, "b" * 32, "c" * 32
    dirs = ["var", "var/lib", "var/lib/acs-agent", root, f"{root}/{source}", f"{root}/{other}"]
    files = [
        f"{root}/{source}/events.jsonl",  # ours
        f"{root}/{source}/history.jsonl",
        f"{root}/{source}/meta.json",  # the source's gateway token and the user's secrets
        f"{root}/{source}/base_state.json",  # the official server's, sealed
        f"{root}/{source}/events/event-00000-x.json",  # the official server's events
        f"{root}/{source}/owner_lease.json",
        f"{root}/{other}/history.jsonl",
        "var/lib/acs-agent/bash_events/x.json",
    ]
    dirs.insert(5, f"{root}/{source}/events")
    entries = [FileEntry(STATE, p, FileKind.DIR) for p in dirs]
    entries += [FileEntry(STATE, p, FileKind.FILE) for p in files]
    carried = Carried(source, new)
    kept = [e.path for e in map(carried.of, entries) if e is not None]
    assert kept == [
        "var",
        "var/lib",
        "var/lib/acs-agent",
        root,
        f"{root}/{new}",
        f"{root}/{new}/events",
        f"{root}/{new}/events.jsonl",
        f"{root}/{new}/history.jsonl",
        f"{root}/{new}/events/event-00000-x.json",
    ]
