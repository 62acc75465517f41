"""The driver contract (tests/drivers/contract.py) with the Docker driver on this host's engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.sandboxes.webhook_listener import WebhookListener
from drivers.base import SandboxDriver
from drivers.docker.driver import DockerDriver
from tests.drivers.contract import *  # noqa: F403 (the shared tests, with the fixture below)
from tests.drivers.contract import Hooks


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
