"""Snapshots attacked from inside a sandbox, as the agent's user: a link put where the image (or
the snapshot the sandbox came from) had a directory must not let a restore write through it,
and a huge sparse file must not have the snapshot copy it (the host's disk, the control plane's
memory): refused before anything is copied, with a clear 413, and the sandbox left running; a
fifo swapped in for a file the helper listed must not hold its copy (nor the snapshot) up; a
workspace nested thousands of directories deep must not end the helper (its walk holds a frame
and a directory per level): a clear 413 as well."""

from __future__ import annotations

import asyncio
from typing import Any

import docker
import pytest

from drivers.files_helper import MAX_DEPTH, merge
from tests.support.snapshot_helpers import container, running, sh, snapshot
from tests.support.types import Client, ClientFactory, UserHeaders


def _entry(path: str, kind: str, **more: Any) -> dict[str, Any]:
    return {"p": path, "k": kind, "t": "system", **more}


def test_nothing_of_a_lower_layer_stays_beneath_an_upper_link_or_file() -> None:
    lower = [
        _entry("home/agent/d", "dir"),
        _entry("home/agent/d/etc", "dir"),
        _entry("home/agent/d/etc/passwd", "file"),
        _entry("home/agent/f", "dir"),
        _entry("home/agent/f/x", "file"),
        _entry("home/agent/keep", "dir"),
        _entry("home/agent/keep/y", "file"),
    ]
    upper = [
        _entry("home/agent/d", "symlink", l="/acs/upper"),
        _entry("home/agent/f", "file"),
    ]
    paths = [entry["p"] for entry in merge(lower, upper)]
    assert paths == [
        "home/agent/d",
        "home/agent/f",
        "home/agent/keep",
        "home/agent/keep/y",
    ]


async def test_a_link_over_a_restored_directory_writes_nothing_through_it(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    first = await running(snap, alice)
    # Outside the workspace: files the agent wrote under a directory of its own.
    await sh(
        docker_client,
        test_prefix,
        first["id"],
        "mkdir -p /home/agent/d/etc && echo 'planted:x:0:0::/:/bin/sh' > /home/agent/d/etc/passwd",
    )
    taken = await snapshot(snap, alice, first["id"])
    second = await running(snap, alice, snapshot_id=taken["id"])
    # In the sandbox made from it, the directory becomes a link to where the restore writes
    # the system tree; the next snapshot (and a sandbox from it) must not follow it.
    await sh(
        docker_client,
        test_prefix,
        second["id"],
        "rm -rf /home/agent/d && ln -s /acs/upper /home/agent/d",
    )
    again = await snapshot(snap, alice, second["id"])
    third = await running(snap, alice, snapshot_id=again["id"])
    seen = await sh(
        docker_client,
        test_prefix,
        third["id"],
        "readlink /home/agent/d; grep -c planted /etc/passwd || true; "
        "test -e /acs/upper/etc/passwd && echo leaked || echo clean",
    )
    assert seen.split() == ["/acs/upper", "0", "clean"], seen


@pytest.fixture
async def small_quota_snap(make_snap_client: ClientFactory) -> Client:
    """Snapshots on, at most 50 MiB of changed files copied by one snapshot."""
    return await make_snap_client(snapshot_max_changed_bytes=50 * 1024 * 1024)


async def test_a_huge_sparse_file_is_refused_before_anything_is_copied(
    small_quota_snap: Client,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    alice = await user_headers("alice")
    source = await running(small_quota_snap, alice)
    # 100 GiB that cost no disk: copying it would fill the host's.
    await sh(docker_client, test_prefix, source["id"], "truncate -s 100G /workspace/huge")
    resp = await small_quota_snap.post(
        f"/api/v1/sandboxes/{source['id']}/snapshots", json={}, headers=alice
    )
    body = await resp.json()
    assert resp.status == 413, body
    assert "107374182400 bytes" in body["detail"], body
    page = await (await small_quota_snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert page["items"] == []
    state = await small_quota_snap.get(f"/api/v1/sandboxes/{source['id']}", headers=alice)
    assert (await state.json())["status"] == "RUNNING"
    # Once it is gone, the same sandbox snapshots as usual.
    await sh(docker_client, test_prefix, source["id"], "rm /workspace/huge")
    assert (await snapshot(small_quota_snap, alice, source["id"]))["sandbox_id"] == source["id"]


SWAPPER = r"""
import os, random, time
names = ["/workspace/z%d" % n for n in range(40)]
for name in names:
    open(name, "w").write("x")
fifo = dict.fromkeys(names, False)
while True:
    name = random.choice(names)
    if fifo[name]:
        open(name + ".t", "w").write("x")
    else:
        os.mkfifo(name + ".t")
    os.replace(name + ".t", name)
    fifo[name] = not fifo[name]
    time.sleep(0.002)
"""
"""Swaps 40 files between a regular file and a fifo, each at its own moments: some are listed
as files by the helper's first look and are fifos by the time it opens them."""


async def test_a_fifo_swapped_in_for_a_file_does_not_hold_the_snapshot(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    # A large file first in the listing: the swaps go on while the helper copies it.
    await sh(
        docker_client, test_prefix, source["id"], "head -c 60000000 /dev/urandom > /workspace/a"
    )
    script = SWAPPER.replace("'", "'\\''")
    await sh(
        docker_client,
        test_prefix,
        source["id"],
        f"nohup python3 -c '{script}' >/dev/null 2>&1 &",
    )
    for _ in range(3):  # each look races the swaps anew
        taken = await asyncio.wait_for(snapshot(snap, alice, source["id"]), timeout=120)
        assert taken["sandbox_id"] == source["id"]
    state = await snap.get(f"/api/v1/sandboxes/{source['id']}", headers=alice)
    assert (await state.json())["status"] == "RUNNING"


NEST = """python3 -c '
import os
os.chdir("/workspace")
for _ in range(5000):
    os.mkdir("d")
    os.chdir("d")
'"""
"""5000 directories, each in the last (past PATH_MAX and Python's recursion limit)."""


async def test_a_workspace_nested_thousands_deep_is_refused_clearly(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], NEST)
    resp = await snap.post(f"/api/v1/sandboxes/{source['id']}/snapshots", json={}, headers=alice)
    body = await resp.json()
    assert resp.status == 413, body
    assert f"nested more than {MAX_DEPTH} levels deep (d/d/d/" in body["detail"], body
    assert "workspace tree" in body["detail"], body
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert page["items"] == []
    state = await snap.get(f"/api/v1/sandboxes/{source['id']}", headers=alice)
    assert (await state.json())["status"] == "RUNNING"
    assert not container(docker_client, test_prefix, source["id"]).attrs["State"]["Paused"]
    # As deep as the limit is kept whole.
    await sh(docker_client, test_prefix, source["id"], "rm -rf /workspace/d")
    await sh(
        docker_client,
        test_prefix,
        source["id"],
        f"cd /workspace && mkdir -p $(seq -s/ {MAX_DEPTH} | tr -d 0-9 | sed 's,/,d/,g')d",
    )
    taken = await snapshot(snap, alice, source["id"])
    restored = await running(snap, alice, snapshot_id=taken["id"])
    deepest = await sh(
        docker_client,
        test_prefix,
        restored["id"],
        "cd /workspace && find . -type d | awk -F/ '{print NF-1}' | sort -n | tail -1",
    )
    assert int(deepest) == MAX_DEPTH
