"""A rewind on real Docker and a real registry takes from the sandbox's old workspace the
checkpoint's files it still holds unchanged (drivers/docker/bases.py: _reuse) and reads only the
others out of the store: whatever the agent did since (writes, deletions, renames, a chmod, a
file replaced by a directory and the reverse, a change hidden by `touch -d`), the workspace is
the checkpoint's exactly, from a plain workspace (all of it read from the store) and from one
already rewound (an overlay on a base: only its lower directory's files are taken, through the
record its base keeps of the files it laid down); and a reuse past its time limit costs speed
only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import docker
import pytest

from controlplane import keys
from controlplane.snapshots.reader import Fetched
from drivers.docker.driver import DockerDriver
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import running, sh, snapshot
from tests.support.types import Client, ClientFactory, UserHeaders

BIG = 3_000_000
WRITE = (
    f"cd /workspace && head -c {BIG} /dev/urandom > big.bin && printf keep > keep.txt"
    " && printf edit > edit.txt && printf gone > gone.txt && printf name > old-name.txt"
    " && printf mode > mode.txt && printf leaf > leaf && mkdir -p tree/deep && printf d"
    " > tree/deep/x.txt && ln -s keep.txt link && printf hush > hush.txt"
)
# After the checkpoint, every kind of change; hush.txt at the same size, its mtime set back.
CHANGE = (
    "cd /workspace && printf EDIT > edit.txt && rm gone.txt && mv old-name.txt new-name.txt"
    " && chmod 600 mode.txt && rm leaf && mkdir leaf && printf in > leaf/inner"
    " && rm -r tree && printf file > tree && rm link && ln -s gone.txt link"
    ' && printf later > later.txt && m="$(stat -c %y hush.txt)" && printf HUSH > hush.txt'
    ' && touch -d "$m" hush.txt'
)
# Everything below /workspace as `find` sees it (kind, mode, owner, size, mtime, link target)
# with each file's sha256: the root itself aside (an overlay shows its upper directory's).
TREE = (
    "cd /workspace && find . -mindepth 1 -printf '%p %y %m %U %G %s %T@ %l\\n' | sort"
    " && find . -type f -exec sha256sum {} + | sort -k2"
)


def rewinder(
    snap: Client, alice: dict[str, str], sandbox_id: str
) -> Callable[[str], Awaitable[int]]:
    async def rewind(snapshot_id: str) -> int:
        """The sandbox rewound to `snapshot_id` (what a conversation's rewind calls) until
        RUNNING; the bytes that took out of the store."""
        service = snap.app[keys.SANDBOXES]
        principal = await snap.app[keys.API_KEYS].authenticate(alice["X-Session-API-Key"])
        record = await service.record(sandbox_id)
        assert record is not None
        before = Fetched.total
        await service.rewind(
            principal.model_copy(update={"org_id": record.org_id}), sandbox_id, snapshot_id
        )
        await wait_status(snap, alice, sandbox_id, "RUNNING", within=90)
        return Fetched.total - before

    return rewind


async def test_a_rewind_reads_only_what_changed_and_brings_the_tree_back_exactly(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    sandbox_id = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, sandbox_id, WRITE)
    tree = await sh(docker_client, test_prefix, sandbox_id, TREE)
    first = await snapshot(snap, alice, sandbox_id)
    rewind = rewinder(snap, alice, sandbox_id)

    # From the plain workspace the sandbox started with: everything out of the store (a file
    # the agent could write proves nothing by its signature: bases.py, _reuse).
    await sh(docker_client, test_prefix, sandbox_id, CHANGE)
    read = await rewind(first["id"])
    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == tree
    assert read > BIG, read

    # From a workspace that is itself a rewind's (an overlay on the first rewind's base): a
    # second checkpoint, more changes, back to it; then back to the first across both.
    await sh(docker_client, test_prefix, sandbox_id, "printf two > /workspace/keep.txt")
    second_tree = await sh(docker_client, test_prefix, sandbox_id, TREE)
    second = await snapshot(snap, alice, sandbox_id)
    await sh(docker_client, test_prefix, sandbox_id, CHANGE)
    read = await rewind(second["id"])
    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == second_tree
    assert 0 < read < BIG, read
    await sh(docker_client, test_prefix, sandbox_id, CHANGE)
    read = await rewind(first["id"])
    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == tree
    assert 0 < read < BIG, read

    # A file the agent wrote in the overlay's upper directory is never taken from there, even
    # untouched since the checkpoint: its bytes could have changed through a shared memory
    # mapping without its ctime (docs/sandboxes.md), so they come out of the store.
    await sh(
        docker_client, test_prefix, sandbox_id, f"head -c {BIG} /dev/urandom > /workspace/up.bin"
    )
    upper_tree = await sh(docker_client, test_prefix, sandbox_id, TREE)
    third = await snapshot(snap, alice, sandbox_id)
    read = await rewind(third["id"])
    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == upper_tree
    assert read > BIG, read


async def test_a_base_that_goes_late_leaves_the_record_of_the_files_linked_from_it_true(
    snap: Client,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rewind links files from the old workspace's base into the new base's lower directory,
    then drops the old workspace, and its base with it: that unlinking sets the linked files'
    ctime (a link count's change), which the new base's record of its files (its stamp)
    holds. Here the old workspace goes late (as under load, issue 28): the record is still
    written after it went, so the next rewind from the new base takes the big file from it
    rather than out of the store."""
    driver = snap.app[keys.SANDBOXES].driver
    assert isinstance(driver, DockerDriver)
    alice = await user_headers("alice")
    sandbox_id = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, sandbox_id, WRITE)
    tree = await sh(docker_client, test_prefix, sandbox_id, TREE)
    first = await snapshot(snap, alice, sandbox_id)
    rewind = rewinder(snap, alice, sandbox_id)
    await rewind(first["id"])  # now on the first snapshot's base
    await sh(docker_client, test_prefix, sandbox_id, "printf two > /workspace/keep.txt")
    second = await snapshot(snap, alice, sandbox_id)

    removal = driver.remove

    async def late(sandbox_id: str, *, keep_workspace: bool = False) -> None:
        if not keep_workspace:  # the old workspace, and the base under it, go 3 s late
            await asyncio.sleep(3)
        await removal(sandbox_id, keep_workspace=keep_workspace)

    monkeypatch.setattr(driver, "remove", late)
    read = await rewind(second["id"])  # links the big file from the first base
    monkeypatch.undo()
    assert 0 < read < BIG, read

    read = await rewind(first["id"])  # the big file linked again, from the second base
    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == tree
    assert 0 < read < BIG, read


async def test_a_reuse_past_its_time_limit_costs_speed_only(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    """ACS_DOCKER_REUSE_TIMEOUT: a rewind from a base whose `reuse` helper does not answer in
    time (here 1 ms, which no helper meets) reads every file out of the store instead and
    brings the tree back exactly (with the default, the same rewind reads less than the big
    file: the test above)."""
    snap = await make_snap_client(docker_reuse_timeout=0.001)
    alice = await user_headers("alice")
    sandbox_id = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, sandbox_id, WRITE)
    first = await snapshot(snap, alice, sandbox_id)
    rewind = rewinder(snap, alice, sandbox_id)
    await rewind(first["id"])  # now on a base, whose lower directory a reuse would link from
    tree = await sh(docker_client, test_prefix, sandbox_id, TREE)
    second = await snapshot(snap, alice, sandbox_id)
    await sh(docker_client, test_prefix, sandbox_id, CHANGE)

    read = await rewind(second["id"])

    assert await sh(docker_client, test_prefix, sandbox_id, TREE) == tree
    assert read > BIG, read
