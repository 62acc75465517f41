"""A fork's base laid down by the export itself (drivers/docker/bases.py: `prepare`): the
export's helper stages its copies in the new base volume and links them into `lower/`, where
the engine used to extract an archive of them. The base must hold the workspace exactly as the
snapshot does (owners, modes with set-id bits, nanosecond times, 0 too, links, directories a
user cannot write), each file once (no staged copy left beside it), and the forks must see it;
laying it down opens each directory about once, not once per entry below it and level above
it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import docker
import pytest

from controlplane import keys
from drivers.base import WORKSPACE, FileEntry, FileItem, FileKind, LocalCopy
from drivers.docker.bases import LABEL_BASE_IMAGE
from drivers.docker.driver import DockerDriver
from drivers.docker.files import LABEL_SNAPSHOT
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE
from drivers.errors import DriverError, ImageMissing
from tests.snapshots.test_fork_ahead import exists, listed, until
from tests.support.log_capture import capture_logs
from tests.support.registry_server import RegistryServer
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import fork_one, running, sh
from tests.support.tcp_relay import TcpRelay
from tests.support.types import Client, ClientFactory, UserHeaders

AS_AGENT = (
    "cd /workspace && mkdir -p d/e ro && echo x > d/e/f && chmod 0640 d/e/f && chmod 2775 d"
    " && ln -s ../d/e/f d/link && ln -s /etc/passwd abs && ln d/e/f hard && : > empty && : > old"
    " && touch -h -d '2001-02-03 04:05:06.789012345' old abs"
    " && echo y > ro/z && chmod 0500 ro && mkfifo fifo"
    " && head -c 3000000 /dev/urandom > blob && echo r > setid && chmod 6755 setid"
    " && mkdir -p epoch/in && touch -d @0 epoch"  # a directory's time of exactly 0 ns
)
# Every entry but the root and the fifo (not kept): path, kind, mode, owner, a file's size, a
# link's target, the mtime to the nanosecond.
LISTING = (
    "find . -mindepth 1 ! -type p \\( -type f -printf '%p|f|%m|%U|%G|%s|%T@\\n'"
    " -o -printf '%p|%y|%m|%U|%G|%l|%T@\\n' \\) | sort"
)


async def test_a_forks_base_is_the_snapshots_workspace_laid_down_once(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], AS_AGENT)
    listed = await sh(docker_client, test_prefix, source["id"], f"cd /workspace && {LISTING}")
    root = await sh(docker_client, test_prefix, source["id"], "stat -c '%a %u %g' /workspace")
    sums = await sh(docker_client, test_prefix, source["id"], "cd /workspace && md5sum blob d/e/f")

    with capture_logs("info") as logs:
        resp = await snap.post(
            f"/api/v1/sandboxes/{source['id']}/fork", json={"count": 2}, headers=alice
        )
        forked = await resp.json()
        assert resp.status == 200, forked
        ids = [s["id"] for s in forked["sandboxes"]]
        for sandbox_id in ids:
            await wait_status(snap, alice, sandbox_id, "RUNNING", within=90)

    # Laid down by the export's helper, every workspace entry (the root, the kept entries).
    (placed,) = logs.events("snapshot_base_placed")
    assert placed["placed"] == len(listed.splitlines()) + 1, placed
    # The system tree and the forks' directories too: the base was whole at the export's end.
    assert placed["system"] >= 0, placed
    assert placed["forks"] == 2, placed
    (cleaned,) = logs.events("snapshot_base_cleaned")
    assert cleaned["cleaned"] >= len([line for line in listed.splitlines() if "|f|" in line])
    assert logs.events("snapshot_base_not_prepared") == []

    made = {"label": [f"{LABEL_SNAPSHOT}={forked['snapshot']['id']}", f"{LABEL_ROLE}=base"]}
    (volume,) = docker_client.volumes.list(filters=made)
    image = snap.app[keys.SPECS].default.image

    def look() -> str:
        script = (
            f"cd /b/lower && {LISTING} && echo -- && stat -c '%a %u %g' /b/lower && echo --"
            " && find /b/lower -type f -links +1 && echo -- && ls -A /b && echo --"
            " && md5sum blob d/e/f"
        )
        out: bytes = docker_client.containers.run(
            image,
            ["-c", script],
            entrypoint="sh",
            user="0:0",
            network_disabled=True,
            volumes={volume.name: {"bind": "/b", "mode": "ro"}},
            remove=True,
        )
        return out.decode()

    base, base_root, linked, top, base_sums = (
        part.strip("\n") for part in (await asyncio.to_thread(look)).split("--\n")
    )
    assert base.splitlines() == listed.splitlines()
    assert base_root == root.strip()
    assert linked == ""  # each file once: no staged copy left beside it
    assert base_sums == sums.strip("\n")
    # Neither the staging nor the ready directory of the export is left in the volume.
    assert set(top.split()) - {"carried.json"} == {"lower", "forks"}, top

    for sandbox_id in ids:
        seen = await sh(
            docker_client,
            test_prefix,
            sandbox_id,
            f"cd /workspace && {LISTING} && md5sum blob d/e/f && cat d/link",
        )
        assert seen == listed + sums + "x\n"
    # A fork writes its own copy: the base and the other fork keep theirs.
    await sh(docker_client, test_prefix, ids[0], "echo mine > /workspace/d/e/f")
    assert (await sh(docker_client, test_prefix, ids[1], "cat /workspace/d/e/f")) == "x\n"


SYSTEM = (
    "mkdir -p /opt/tool/bin && printf 'run' > /opt/tool/bin/t && chmod 4750 /opt/tool/bin/t"
    " && chmod 0700 /opt/tool && ln -s bin/t /opt/tool/t && rm /etc/issue"
    " && rm -rf /usr/share/doc && mkdir /usr/share/doc && echo n > /usr/share/doc/new"
)
SYSTEM_LOOK = (
    "stat -c '%a %u %g %s' /opt/tool /opt/tool/bin/t && cat /opt/tool/bin/t && echo"
    " && readlink /opt/tool/t && (test -e /etc/issue && echo issue || echo no-issue)"
    " && ls -A /usr/share/doc"
)


async def test_a_forks_system_tree_is_laid_down_by_the_export(
    make_snap_client: ClientFactory,
    registry: RegistryServer,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    """What the agent changed outside the workspace (a file with set-id bits, an owner, a
    link; a file of the image deleted: a whiteout; a directory of the image replaced: opaque)
    is laid down by the export's helper in the layer the base's image is committed from, with
    the forks' directories, so the base is whole at the export's end (not the stream's): the
    forks see the system tree as the source had it, the image's hidden files hidden. The store
    is held (a relay) until the forks' containers are made: the forks started before the
    snapshot was sealed, which a small snapshot sealed at once could not show."""
    relay = await TcpRelay.started(registry.url)
    try:
        snap = await make_snap_client(snapshot_store_url=relay.url, snapshot_store_timeout=60)
        alice = await user_headers("alice")
        source = (await running(snap, alice))["id"]
        await sh(docker_client, test_prefix, source, SYSTEM, user="root")
        await sh(docker_client, test_prefix, source, "head -c 3000000 /dev/urandom > /workspace/b")
        seen = await sh(docker_client, test_prefix, source, SYSTEM_LOOK, user="root")
        assert seen.splitlines()[-2:] == ["no-issue", "new"], seen
        with capture_logs("info") as logs:
            relay.stall_after(64 * 1024)  # the pack's bytes held: the snapshot cannot be sealed
            forking = asyncio.create_task(
                snap.post(f"/api/v1/sandboxes/{source}/fork", json={"count": 2}, headers=alice)
            )

            async def forks_made() -> bool:
                ids = [i for i in await listed(snap, alice) if i != source]
                return len(ids) == 2 and all(exists(docker_client, test_prefix, i) for i in ids)

            await until("the forks' containers made", forks_made, within=120)
            assert relay.stalled.is_set()
            assert not forking.done()  # it answers once the snapshot is sealed
            relay.restore()
            resp = await asyncio.wait_for(forking, 120)
            forked = await resp.json()
            assert resp.status == 200, forked
            ids = [s["id"] for s in forked["sandboxes"]]
            for sandbox_id in ids:
                await wait_status(snap, alice, sandbox_id, "RUNNING", within=90)
    finally:
        await relay.close()
    (placed,) = logs.events("snapshot_base_placed")
    assert placed["system"] >= 5, placed  # opt, tool, bin, t, the link, the whiteout, doc...
    assert placed["forks"] == 2, placed
    (built,) = logs.events("snapshot_base_built")
    assert built["staged"] is True, built
    (forked_event,) = logs.events("sandbox_forked")
    assert forked_event["ahead"] is True, forked_event
    for sandbox_id in ids:
        assert await sh(docker_client, test_prefix, sandbox_id, SYSTEM_LOOK, user="root") == seen


DEPTH = 30
FILES = 400
DEEP = (
    f'cd /workspace && d=$(printf \'level/%.0s\' $(seq {DEPTH})) && mkdir -p "$d" && cd "$d"'
    f" && for i in $(seq {FILES}); do : > f$i; done && mkdir -p sub && : > sub/g"
)


async def test_placing_a_deep_directory_opens_each_directory_about_once(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """Many entries in one deep directory: `place` keeps the directories above the last entry
    open (files_helper.py `Parents`), so it opens each directory once to make the entries in it
    and once more to set its mode and time; reopening every level from the root for each entry
    opened DEPTH directories per file (12,000 here)."""
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], DEEP)
    count = "find /workspace -type d | wc -l && find /workspace | wc -l"
    dirs, entries = map(int, (await sh(docker_client, test_prefix, source["id"], count)).split())
    with capture_logs("info") as logs:
        fork, _ = await fork_one(snap, alice, source["id"])
    (placed,) = logs.events("snapshot_base_placed")
    assert placed["placed"] == entries, placed
    # The root is the helper's own descriptor; every other directory: opened for its entries
    # (the deepest's subdirectory among them: DFS order returns to a kept parent), and for its
    # mode and time.
    assert placed["opened"] <= 2 * (dirs - 1) + 2, placed
    listed = "cd /workspace && find . | sort | md5sum"
    assert await sh(docker_client, test_prefix, fork, listed) == await sh(
        docker_client, test_prefix, source["id"], listed
    )


class _Unrecorded:
    """The export's Hold, with no record to keep (the control plane's is the taker's)."""

    async def begin(self) -> None:
        return None

    async def end(self) -> None:
        return None


async def test_an_export_that_fails_after_staging_leaves_no_base(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The base volume is made before the export's helper stages in it: an export left half
    read (the writer failed) removes it, once the helper holding it is gone; a fork's export
    read to its end gives the build a whole workspace."""
    alice = await user_headers("alice")
    source = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, source, "head -c 20000000 /dev/urandom > /workspace/big")
    driver = snap.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    image = snap.app[keys.SPECS].default.image
    key = secrets.token_hex(16)
    made = {"label": f"{LABEL_SNAPSHOT}={key}"}
    export = driver.files.export(
        source,
        {},
        working_dir="/workspace",
        state_paths=(),
        hold=_Unrecorded(),
        local=LocalCopy(key, image),
    )
    staged_in: list[object] = []

    async def read_then_fail() -> None:
        async with export as files:
            staged_in.extend(docker_client.volumes.list(filters=made))
            async for item in files.items:
                if isinstance(item, bytes):
                    raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        await read_then_fail()
    assert staged_in != []
    assert docker_client.volumes.list(filters=made) == []
    owned: dict[str, str | list[str] | bool] = {
        "label": [f"{LABEL_OWNER}={test_prefix}", f"{LABEL_ROLE}=files"]
    }
    assert docker_client.containers.list(all=True, filters=owned) == []
    assert (await sh(docker_client, test_prefix, source, "stat -c %s /workspace/big")) == (
        "20000000\n"
    )


async def test_a_prepared_base_whose_image_goes_before_its_build_is_removed(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The image is removed between `prepare` and the build: the build fails before it takes
    the prepared volume, the snapshot stays listed (its `forget` comes only with its deletion)
    and the sweep leaves a prepared volume alone, so the build drops it itself once the
    export's helper is gone, while the export goes on to its end."""
    alice = await user_headers("alice")
    source = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, source, "echo kept > /workspace/f")
    driver = snap.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    image = snap.app[keys.SPECS].default.image
    copy = f"{test_prefix.strip('-')}-gone:{secrets.token_hex(4)}"  # a tag of the image
    assert await asyncio.to_thread(docker_client.images.get(image).tag, copy)
    key = secrets.token_hex(16)
    made = {"label": f"{LABEL_SNAPSHOT}={key}"}
    export = driver.files.export(
        source,
        {},
        working_dir="/workspace",
        state_paths=(),
        hold=_Unrecorded(),
        local=LocalCopy(key, copy),
    )
    try:
        async with export as files:
            assert docker_client.volumes.list(filters=made) != []  # prepared
            await asyncio.to_thread(docker_client.images.remove, copy)  # the tag alone
            with pytest.raises(ImageMissing):
                await driver.files.build_local(key, copy, files.items, ())
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            await asyncio.to_thread(docker_client.images.remove, copy)
    for _ in range(120):  # dropped once the export's helper is removed
        if not await asyncio.to_thread(docker_client.volumes.list, filters=made):
            break
        await asyncio.sleep(0.5)
    assert docker_client.volumes.list(filters=made) == []
    assert (await sh(docker_client, test_prefix, source, "cat /workspace/f")) == "kept\n"


async def test_a_base_built_again_waits_for_the_helper_of_a_failed_staged_build(
    snap: Client, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """A prepared base whose build failed (its helper never said how it laid the workspace
    down) is removed only once that helper is gone (`_undo`): a build of the same base that
    comes first (the forks' restore from the store) finds the volume still held, and waits for
    the helper rather than failing on a volume the engine counts in use."""
    driver = snap.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    bases = driver.files.bases
    image = snap.app[keys.SPECS].default.image
    key = secrets.token_hex(16)
    staging = await bases.prepare(key, image)
    # The export's helper, still holding the base volume (as a real one does until removed).
    helper = await asyncio.to_thread(
        docker_client.containers.create,
        image,
        ["true"],
        entrypoint="sh",
        name=f"{test_prefix}files-{secrets.token_hex(6)}",
        labels={LABEL_OWNER: test_prefix, LABEL_ROLE: "files"},
        volumes={staging.volume: {"bind": "/acs/into", "mode": "rw"}},
        network_disabled=True,
    )

    def root() -> AsyncIterator[FileItem]:
        async def items() -> AsyncIterator[FileItem]:
            yield FileEntry(tree=WORKSPACE, path="", kind=FileKind.DIR, mode=0o755)

        return items()

    with pytest.raises(DriverError, match="did not say how it laid the workspace down"):
        await bases.build(key, image, root(), ())

    async def helper_goes() -> None:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(helper.remove, force=True)
        staging.release()

    going = asyncio.create_task(helper_goes())
    try:
        await bases.build(key, image, root(), ())
        assert going.done()  # it waited for the helper
    finally:
        await asyncio.gather(going, return_exceptions=True)
        await bases.forget(key)
    made = {"label": f"{LABEL_SNAPSHOT}={key}"}
    assert docker_client.volumes.list(filters=made) == []


async def test_a_base_whose_image_is_still_run_keeps_its_volume(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The last fork of a base goes while a container (not a sandbox of ours) still runs the
    base's image: the engine refuses the image's removal (409), so the base's volume stays
    too (an image without its lower/ would be a base no sandbox can stand on); once that
    container goes, the next release removes both."""
    alice = await user_headers("alice")
    source = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, source, "echo kept > /workspace/f")
    fork, forked = await fork_one(snap, alice, source)
    made = {"label": [f"{LABEL_SNAPSHOT}={forked['snapshot']['id']}", f"{LABEL_ROLE}=base"]}
    (volume,) = docker_client.volumes.list(filters=made)
    image = str(volume.attrs["Labels"][LABEL_BASE_IMAGE])
    holding = await asyncio.to_thread(
        docker_client.containers.create,
        image,
        ["true"],
        entrypoint="sh",
        name=f"{test_prefix}holds-{secrets.token_hex(4)}",
        network_disabled=True,
    )
    try:
        gone = await snap.delete(f"/api/v1/sandboxes/{fork}", headers=alice)
        assert gone.status == 200, await gone.text()
        driver = snap.app[keys.DRIVER]
        assert isinstance(driver, DockerDriver)
        await driver.files.bases.release(volume.name)
        assert [v.name for v in docker_client.volumes.list(filters=made)] == [volume.name]
        assert docker_client.images.get(image) is not None
    finally:
        await asyncio.to_thread(holding.remove, force=True)
    await driver.files.bases.release(volume.name)
    assert docker_client.volumes.list(filters=made) == []
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(image)
