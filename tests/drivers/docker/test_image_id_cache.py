"""Image ids are known without asking the engine while its image events are followed, and a
rebuild (any image event) is seen at once: a start never uses the id of an image that changed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import docker
import pytest

from drivers.docker import DockerDriver
from tests.support.docker_fixtures import DEFAULT_IMAGE, run_prefix

T = TypeVar("T")


class CountingDriver(DockerDriver):
    """The real driver, counting the image look-ups it sends to the engine."""

    def __init__(self) -> None:
        super().__init__()
        self.look_ups = 0

    async def _call(
        self, fn: Callable[[docker.DockerClient], T], operation: str = "other", lane: str = "quick"
    ) -> T:
        if operation == "image_exists":
            self.look_ups += 1
        return await super()._call(fn, operation, lane)


@pytest.fixture
async def driver() -> AsyncIterator[CountingDriver]:
    driver = CountingDriver()
    yield driver
    await driver.close()


@pytest.fixture
def scratch_tag(
    docker_client: docker.DockerClient, sandbox_images: None
) -> Iterator[tuple[str, str]]:
    repository = f"acs-test-image-ids-{run_prefix()}".lower().rstrip("-")
    name = f"{repository}:latest"
    yield repository, name
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(name)


async def _until(check: Callable[[], Any], what: str, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_known_id_needs_no_engine_call_and_a_retag_is_seen(
    driver: CountingDriver, docker_client: docker.DockerClient, scratch_tag: tuple[str, str]
) -> None:
    repository, name = scratch_tag
    first = docker_client.images.get("acs-base:bookworm")
    second = docker_client.images.get(DEFAULT_IMAGE)
    assert first.id != second.id
    first.tag(repository, "latest")
    assert await driver.image_id(name) == first.id

    async def answered_from_memory() -> bool:
        before = driver.look_ups
        found = await driver.image_id(name)
        assert found == first.id
        return driver.look_ups == before

    # The first answer may land while the event stream is still being opened (then it is not
    # kept); from then on the id is known.
    await _until(answered_from_memory, "the image id was never kept")
    before = driver.look_ups
    for _ in range(5):
        assert await driver.image_id(name) == first.id
    assert driver.look_ups == before

    # A rebuild moves the tag to another image: the next starts must see it.
    second.tag(repository, "latest")

    async def moved() -> bool:
        return await driver.image_id(name) == second.id

    await _until(moved, "the re-tagged image's id was never seen")
    docker_client.images.remove(name)

    async def gone() -> bool:
        return await driver.image_id(name) is None

    await _until(gone, "the removed tag was still reported")
