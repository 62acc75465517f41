"""Snapshots through the API on real Docker and a real registry: take, read, search, restore
(workspace and what the agent changed outside it), incremental and deduplicated storage, fork,
delete; a snapshot of a deleted sandbox still restores."""

from __future__ import annotations

import asyncio

import docker

from controlplane import keys
from drivers.docker.driver import DockerDriver
from drivers.docker.files import LABEL_SNAPSHOT, Lane
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import fork_one, running, sh, snapshot
from tests.support.types import Client, ClientFactory, UserHeaders

WRITE = (
    "mkdir -p /workspace/src && printf 'print(42)\\n' > /workspace/src/main.py"
    " && head -c 3000000 /dev/urandom > /workspace/blob.bin"
    " && ln -s src/main.py /workspace/link && mkdir -p /home/agent/.local"
    " && echo installed > /home/agent/.local/tool && chmod 600 /workspace/src/main.py"
)


async def test_take_restore_and_delete(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], WRITE)
    await sh(docker_client, test_prefix, source["id"], "rm /etc/issue", user="root")

    first = await snapshot(snap, alice, source["id"], name="before")
    assert first["sandbox_id"] == source["id"]
    assert first["sandbox_spec_id"] == "default"
    assert first["parent_id"] is None
    assert first["name"] == "before"
    assert first["size_bytes"] >= 3_000_000
    assert 0 < first["held_still_seconds"] < 2
    got = await snap.get(f"/api/v1/snapshots/{first['id']}", headers=alice)
    assert got.status == 200
    assert await got.json() == first

    # A small change: the next snapshot stores about that change, against the first.
    await sh(docker_client, test_prefix, source["id"], "echo more >> /workspace/src/main.py")
    second = await snapshot(snap, alice, source["id"])
    assert second["parent_id"] == first["id"]
    assert second["stored_bytes"] < first["stored_bytes"] / 10, (first, second)

    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert [s["id"] for s in page["items"]] == [second["id"], first["id"]]
    assert page["next_page_id"] is None
    one = await (await snap.get("/api/v1/snapshots/search?limit=1", headers=alice)).json()
    assert [s["id"] for s in one["items"]] == [second["id"]]
    rest = await snap.get(
        f"/api/v1/snapshots/search?limit=1&page_id={one['next_page_id']}", headers=alice
    )
    assert [s["id"] for s in (await rest.json())["items"]] == [first["id"]]

    # The source goes; its first snapshot still makes a sandbox with its files.
    assert (await snap.delete(f"/api/v1/sandboxes/{source['id']}", headers=alice)).status == 200
    restored = await running(snap, alice, snapshot_id=first["id"])
    assert restored["snapshot_id"] == first["id"]
    assert restored["session_api_key"] not in (None, source["session_api_key"])
    listing = await sh(
        docker_client,
        test_prefix,
        restored["id"],
        "cat /workspace/src/main.py; readlink /workspace/link; stat -c '%a %U' "
        "/workspace/src/main.py; cat /home/agent/.local/tool; test ! -e /etc/issue && echo gone;"
        " wc -c < /workspace/blob.bin; touch /workspace/new && echo writable",
    )
    assert listing.split() == [
        "print(42)",
        "src/main.py",
        "600",
        "agent",
        "installed",
        "gone",
        "3000000",
        "writable",
    ]

    assert (await snap.delete(f"/api/v1/snapshots/{first['id']}", headers=alice)).status == 200
    assert (await snap.get(f"/api/v1/snapshots/{first['id']}", headers=alice)).status == 404
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    assert [s["id"] for s in page["items"]] == [second["id"]]
    # The restored sandbox does not need the snapshot any more.
    await sh(docker_client, test_prefix, restored["id"], "test -s /workspace/blob.bin")


async def test_fork_starts_each_with_its_own_identity(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], "echo shared > /workspace/state")
    # Outside the workspace (the system tree: a file written, one of the image's deleted): the
    # forks' base is built from the source's files as the snapshot reads them.
    await sh(
        docker_client,
        test_prefix,
        source["id"],
        "mkdir -p /home/agent/.local && echo installed > /home/agent/.local/tool",
    )
    await sh(docker_client, test_prefix, source["id"], "rm /etc/issue", user="root")
    resp = await snap.post(
        f"/api/v1/sandboxes/{source['id']}/fork", json={"count": 3}, headers=alice
    )
    forked = await resp.json()
    assert resp.status == 200, forked
    assert len(forked["sandboxes"]) == 3
    ids = [s["id"] for s in forked["sandboxes"]]
    keys = set()
    for sandbox_id in ids:
        body = await wait_status(snap, alice, sandbox_id, "RUNNING", within=90)
        keys.add(body["session_api_key"])
        assert body["snapshot_id"] == forked["snapshot"]["id"]
    assert len(keys) == 3
    assert source["session_api_key"] not in keys
    for sandbox_id in ids:
        seen = await sh(
            docker_client,
            test_prefix,
            sandbox_id,
            "cat /workspace/state /home/agent/.local/tool;"
            " test -e /etc/issue && echo issue || echo no-issue",
        )
        assert seen.split() == ["shared", "installed", "no-issue"], seen

    # Each writes its own copy: a change in one is seen in no other, nor in the source.
    await sh(docker_client, test_prefix, ids[0], "echo mine > /workspace/state")
    for other in (ids[1], ids[2], source["id"]):
        assert (await sh(docker_client, test_prefix, other, "cat /workspace/state")) == "shared\n"
    assert (await sh(docker_client, test_prefix, ids[0], "cat /workspace/state")) == "mine\n"

    over = await snap.post(
        f"/api/v1/sandboxes/{source['id']}/fork", json={"count": 101}, headers=alice
    )
    assert over.status == 422


async def test_a_fork_over_the_copy_bound_takes_what_changed(
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    """A fork's snapshot reads the whole workspace to build the forks' base beside it; a
    workspace over ACS_SNAPSHOT_MAX_CHANGED_BYTES whose changes since the last snapshot are
    under it still forks (an incremental snapshot, the base built from the store)."""
    bounded = await make_snap_client(snapshot_max_changed_bytes=20 * 1024 * 1024)
    alice = await user_headers("alice")
    source = await running(bounded, alice)
    for name in ("a", "b"):  # 24 MB in all, each snapshot copying 12
        await sh(
            docker_client,
            test_prefix,
            source["id"],
            f"head -c 12000000 /dev/urandom > /workspace/{name}",
        )
        await snapshot(bounded, alice, source["id"])
    await sh(docker_client, test_prefix, source["id"], "echo late > /workspace/late")
    fork, _ = await fork_one(bounded, alice, source["id"])
    seen = await sh(
        docker_client,
        test_prefix,
        fork,
        "cat /workspace/late; stat -c %s /workspace/a /workspace/b",
    )
    assert seen.split() == ["late", "12000000", "12000000"], seen


async def test_a_fork_never_waits_on_the_lane_its_own_build_holds(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The forks' base is built beside the export: its upload to the engine waits for the
    export's next bytes, which the export reads in a thread of the files' lane. With every
    thread of that lane held by such uploads (here the lane has one; by default four forks at
    once), a build that held one would wait for an export that can never get one."""
    driver = snap.app[keys.SANDBOXES].driver
    assert isinstance(driver, DockerDriver)
    files = driver.files
    old = files.lane
    one = Lane(old.engine, 1)  # the app's close closes it
    files.lane = files.bases._lane = files.exports._lane = one
    old.close()  # what it runs now finishes
    alice = await user_headers("alice")
    source = await running(snap, alice)
    # More than the tee's, the archive's and one batch's buffers hold together.
    await sh(
        docker_client, test_prefix, source["id"], "head -c 48000000 /dev/urandom > /workspace/big"
    )
    resp = await asyncio.wait_for(
        snap.post(f"/api/v1/sandboxes/{source['id']}/fork", json={"count": 1}, headers=alice),
        120,
    )
    forked = await resp.json()
    assert resp.status == 200, forked
    (fork,) = [s["id"] for s in forked["sandboxes"]]
    await wait_status(snap, alice, fork, "RUNNING", within=90)
    seen = await sh(docker_client, test_prefix, fork, "stat -c %s /workspace/big")
    assert seen.split() == ["48000000"], seen


async def test_a_forks_base_holds_nothing_of_the_agent_state(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The forks' base is built from the export the snapshot reads, which holds the agent's
    state (credentials scoped to the source): a fork gets the restored trees only, as a
    restore out of the store does, and none of the state tree through the base."""
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(
        docker_client,
        test_prefix,
        source["id"],
        "mkdir -p /var/lib/acs-agent/keys && echo hush > /var/lib/acs-agent/keys/token"
        " && echo kept > /workspace/kept",
    )
    fork, forked = await fork_one(snap, alice, source["id"])
    # As the agent, whose directory it is (a failing `ls` fails the test).
    seen = await sh(
        docker_client, test_prefix, fork, "cat /workspace/kept; ls -A /var/lib/acs-agent"
    )
    assert seen.split()[0] == "kept", seen
    assert "keys" not in seen.split(), seen
    found = docker_client.volumes.list(
        filters={"label": f"{LABEL_SNAPSHOT}={forked['snapshot']['id']}"}
    )
    assert found, "the fork did not start from a base built beside its snapshot"
