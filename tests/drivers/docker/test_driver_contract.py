"""The driver contract (tests/drivers/contract.py) with the Docker driver on this host's engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import docker
import docker.errors
import pytest

from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.specs.models import SandboxSpec
from drivers.base import SandboxDriver
from drivers.docker import names
from drivers.docker.driver import DockerDriver
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE, ROLE
from tests.drivers.contract import *  # noqa: F403 (the shared tests, with the fixture below)
from tests.drivers.contract import Hooks, MakeRequest, marked


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


async def test_a_remove_right_after_a_snapshot_takes_the_helper_still_holding_the_workspace(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec, test_prefix: str
) -> None:
    """A snapshot's helper is removed in the background once its export is read; a rewind or a
    delete right after it met the workspace volume "in use" (a rewind ended in ERROR). The
    helper still running here is made as the driver makes one: this deployment's labels, the
    workspace mounted."""
    request, _key, _state = await marked(driver, make_request, spec)
    volume = names.volume_name(test_prefix, request.sandbox_id)
    engine = docker.from_env()
    try:
        helper = engine.containers.run(
            spec.image,
            ["sleep", "300"],
            detach=True,
            name=f"{test_prefix}files-lingering",
            labels={LABEL_OWNER: test_prefix, LABEL_ROLE: ROLE},
            volumes={volume: {"bind": "/acs/ws", "mode": "ro"}},
            network_mode="none",
        )
        await driver.remove(request.sandbox_id)
        assert await driver.inspect(request.sandbox_id) is None
        assert not engine.volumes.list(filters={"name": volume})
        with pytest.raises(docker.errors.NotFound):
            helper.reload()
    finally:
        engine.close()
