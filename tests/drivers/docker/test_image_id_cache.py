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

from drivers.docker.driver import DockerDriver
from drivers.docker.engine import QUICK, DockerEngine
from tests.support.docker_fixtures import run_prefix
from tests.support.sandbox_helpers import DEFAULT_IMAGE

T = TypeVar("T")


class CountingEngine(DockerEngine):
    """The real engine, counting the image look-ups the driver sends it."""

    def __init__(self) -> None:
        super().__init__()
        self.look_ups = 0

    async def call(
        self, fn: Callable[[docker.DockerClient], T], operation: str = "other", lane: str = QUICK
    ) -> T:
        if operation == "image_exists":
            self.look_ups += 1
        return await super().call(fn, operation, lane)


class CountingDriver(DockerDriver):
    """The real driver on a counting engine (every engine call of the driver goes through
    `self.engine`; the one its constructor made has opened nothing yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = self.counting = CountingEngine()

    @property
    def look_ups(self) -> int:
        return self.counting.look_ups


@pytest.fixture
async def counting_driver() -> AsyncIterator[CountingDriver]:
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
    counting_driver: CountingDriver,
    docker_client: docker.DockerClient,
    scratch_tag: tuple[str, str],
) -> None:
    repository, name = scratch_tag
    first = docker_client.images.get("acs-base:bookworm")
    second = docker_client.images.get(DEFAULT_IMAGE)
    assert first.id != second.id
    first.tag(repository, "latest")
    assert await counting_driver.image_id(name) == first.id
    # The first answer was the engine's: the count sees the driver's look-ups (it once counted
    # a method the driver no longer called, and this test could not fail).
    assert counting_driver.look_ups == 1

    async def answered_from_memory() -> bool:
        before = counting_driver.look_ups
        found = await counting_driver.image_id(name)
        assert found == first.id
        return counting_driver.look_ups == before

    # The first answer may land while the event stream is still being opened (then it is not
    # kept); from then on the id is known.
    await _until(answered_from_memory, "the image id was never kept")
    before = counting_driver.look_ups
    for _ in range(5):
        assert await counting_driver.image_id(name) == first.id
    assert counting_driver.look_ups == before

    # A rebuild moves the tag to another image: the next starts must see it.
    second.tag(repository, "latest")

    async def moved() -> bool:
        return await counting_driver.image_id(name) == second.id

    await _until(moved, "the re-tagged image's id was never seen")
    docker_client.images.remove(name)

    async def gone() -> bool:
        return await counting_driver.image_id(name) is None

    await _until(gone, "the removed tag was still reported")
