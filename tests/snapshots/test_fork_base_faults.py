"""A fork's base built from the export as it streams (DockerBases.build), cancelled while the
engine commits its image (the snapshot beside it failed, or the service closes): nothing of it
is left on the engine, the image included, which no sweep removes. And the export's helper
killed while it lays the workspace down in the base: nothing is harmed, nothing left."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import docker

from controlplane import keys
from drivers.base import SYSTEM, WORKSPACE, FileEntry, FileItem, FileKind
from drivers.docker.bases import LABEL_BASE
from drivers.docker.driver import DockerDriver
from drivers.docker.files import LABEL_SNAPSHOT
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE
from tests.support.log_capture import capture_logs
from tests.support.sandbox_helpers import wait_status
from tests.support.snapshot_helpers import running, sh
from tests.support.types import Client, UserHeaders

BIG = 256 << 20  # in the holder's layer: its commit lasts long enough to land in
PIECE = 1 << 20


async def test_a_build_cancelled_while_its_image_is_committed_leaves_nothing(
    snap: Client, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    driver = snap.app[keys.SANDBOXES].driver
    assert isinstance(driver, DockerDriver)
    image = snap.app[keys.SPECS].default.image
    key = secrets.token_hex(16)  # a snapshot id of its own
    streamed = asyncio.Event()

    async def items() -> AsyncIterator[FileItem]:
        yield FileEntry(WORKSPACE, "", FileKind.DIR, 0o755)
        yield FileEntry(SYSTEM, "big", FileKind.FILE, 0o644, size=BIG)
        for _ in range(BIG // PIECE):
            yield bytes(PIECE)
        streamed.set()

    def loaders() -> list[object]:
        """The loader containers (the list alone: inspecting one waits for its extraction)."""
        owned = [f"{LABEL_OWNER}={test_prefix}", f"{LABEL_ROLE}=files"]
        return list(docker_client.api.containers(all=True, filters={"label": owned}))

    building = asyncio.create_task(driver.files.build_local(key, image, items(), ["x"]))
    await asyncio.wait_for(streamed.wait(), 120)
    # Extracted: the loader goes, then the holder's layer is committed (the engine's state).
    while await asyncio.to_thread(loaders):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    assert not building.done()
    building.cancel()
    await asyncio.gather(building, return_exceptions=True)
    await asyncio.sleep(10)  # whatever the engine was doing lands

    made: dict[str, str | list[str] | bool] = {"label": f"{LABEL_SNAPSHOT}={key}"}
    assert docker_client.images.list(filters=made) == []
    assert docker_client.volumes.list(filters=made) == []
    assert docker_client.containers.list(all=True, filters=made) == []


MANY = (
    "cd /workspace && for d in $(seq 20); do mkdir -p many/$d && cd many/$d"
    " && for f in $(seq 1000); do echo $f > $f; done && cd /workspace; done"
)
"""20,000 small files: their placement lasts long enough for the kill to land inside it."""


async def test_an_export_helper_killed_while_it_places_harms_nothing(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    """The fork's export helper dies while it lays the workspace down in the new base (after
    its listing, while the engine streams its copies): the build gets no word of the placement
    and fails (the prepared base removed once the helper is gone: the forks then build theirs
    from the store); the snapshot is either
    whole and listed (its forks then build their base from the store, every chunk checked) or
    not listed at all; the source keeps running with its files; nothing is left."""
    alice = await user_headers("alice")
    source = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, source, MANY)
    digest = "cd /workspace && find . -type f | sort | xargs cat | md5sum"
    before = await sh(docker_client, test_prefix, source, digest)
    owned: dict[str, str | list[str] | bool] = {
        "label": [f"{LABEL_OWNER}={test_prefix}", f"{LABEL_ROLE}=files"]
    }

    def placing() -> bool:
        """Kill the fork's export helper once it has begun to lay the workspace down."""
        for helper in docker_client.containers.list(filters=owned):
            with contextlib.suppress(docker.errors.APIError):
                if helper.exec_run(["test", "-d", "/acs/into/lower"]).exit_code == 0:
                    helper.kill()
                    return True
        return False

    with capture_logs("info") as logs:
        forking = asyncio.create_task(
            snap.post(f"/api/v1/sandboxes/{source}/fork", json={"count": 1}, headers=alice)
        )
        killed = False
        while not killed and not forking.done():
            killed = await asyncio.to_thread(placing)
        resp = await forking
        answer = await resp.json()
    assert killed, "the helper was not caught placing"
    # Killed while it placed: no word of a whole placement, and no base. The kill may land
    # just after the helper's word (which comes at once, while the engine still streams the
    # copies): then the base was whole (built on that word, the forks on it) and only the
    # removal of its staged copies is lost; what follows holds either way.
    for word in logs.events("snapshot_base_placed"):
        assert word["placed"] == word["listed"], word
    page = await (await snap.get("/api/v1/snapshots/search", headers=alice)).json()
    if resp.status == 200:
        (fork,) = [s["id"] for s in answer["sandboxes"]]
        assert [s["id"] for s in page["items"]] == [answer["snapshot"]["id"]]
        await wait_status(snap, alice, fork, "RUNNING", within=120)
        assert await sh(docker_client, test_prefix, fork, digest) == before
    else:
        assert resp.status >= 500, answer
        assert page["items"] == []
    assert (await wait_status(snap, alice, source, "RUNNING"))["status"] == "RUNNING"
    assert await sh(docker_client, test_prefix, source, digest) == before

    def left() -> list[str]:
        """Helpers of the export, and base volumes no sandbox stands on."""
        found = [str(c.name) for c in docker_client.containers.list(all=True, filters=owned)]
        bases = {"label": [f"{LABEL_OWNER}={test_prefix}", f"{LABEL_ROLE}=base"]}
        used = {"label": [f"{LABEL_BASE}"]}
        standing = {
            (v.attrs.get("Labels") or {}).get(LABEL_BASE)
            for v in docker_client.volumes.list(filters=used)
        }
        found += [
            str(v.name) for v in docker_client.volumes.list(filters=bases) if v.name not in standing
        ]
        return found

    for _ in range(120):
        if not await asyncio.to_thread(left):
            break
        await asyncio.sleep(0.5)
    assert await asyncio.to_thread(left) == []
