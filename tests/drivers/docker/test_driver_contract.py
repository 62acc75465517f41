"""The driver contract (tests/drivers/contract.py) with the Docker driver on this host's engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import docker
import pytest
from docker.errors import NotFound
from docker.types import Mount

from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.specs.models import SandboxSpec
from drivers.base import SandboxDriver
from drivers.docker import names
from drivers.docker.driver import DockerDriver
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE
from drivers.errors import DriverError
from tests.drivers.contract import *  # noqa: F403 (the shared tests, with the fixture below)
from tests.drivers.contract import Hooks, MakeRequest, running


# The one fixture name defined in several places on purpose: each runtime's contract module gives
# the shared tests its `driver` (tests/test_fixture_names.py allows exactly this).
@pytest.fixture
async def driver(test_prefix: str, hooks: Hooks) -> AsyncIterator[SandboxDriver]:
    """A driver for this test's deployment prefix (its objects are removed after the test)."""
    listener = WebhookListener(0)
    listener.attach(hooks.app)
    # /24s, as the other tests' networks: room for the parallel runs on one engine.
    made = DockerDriver(prefix=test_prefix, listener=listener, subnet_size=24)
    yield made
    await made.close()
    await listener.close()


async def test_a_remove_right_after_an_export_takes_the_leftover_helper_not_a_sandbox(
    driver: SandboxDriver,
    make_request: MakeRequest,
    spec: SandboxSpec,
    docker_client: docker.DockerClient,
) -> None:
    """An export's helper is removed in the background when the export ends; a rewind or a
    delete that comes first must not fail on the workspace still mounted by it, and must never
    take away another container that mounts it."""
    assert isinstance(driver, DockerDriver)
    request = await make_request()
    await running(driver, request, spec)
    volume = names.volume_name(driver.prefix, request.sandbox_id)
    client = docker_client
    mounts = [Mount("/acs/ws", volume, type="volume", read_only=True)]

    def leftover(labels: dict[str, str]) -> str:
        config = client.api.create_host_config(mounts=mounts, network_mode="none")
        made = client.api.create_container(
            request.image, ["true"], labels=labels, host_config=config
        )
        return str(made["Id"])

    other = leftover({})  # not a helper: the removal fails rather than take it
    try:
        with pytest.raises(DriverError, match="in use"):
            await driver.remove(request.sandbox_id)
    finally:
        client.api.remove_container(other, force=True)

    await running(driver, request, spec)
    helper = leftover({LABEL_OWNER: driver.prefix, LABEL_ROLE: "files"})
    await driver.remove(request.sandbox_id)
    assert await driver.inspect(request.sandbox_id) is None
    with pytest.raises(NotFound):
        client.api.inspect_volume(volume)
    with pytest.raises(NotFound):
        client.api.inspect_container(helper)
