"""A fork's base built from the export as it streams (DockerBases.build), cancelled while the
engine commits its image (the snapshot beside it failed, or the service closes): nothing of it
is left on the engine, the image included, which no sweep removes."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import docker

from controlplane import keys
from drivers.base import SYSTEM, WORKSPACE, FileEntry, FileItem, FileKind
from drivers.docker.driver import DockerDriver
from drivers.docker.files import LABEL_SNAPSHOT
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE
from tests.support.types import Client

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
