"""Bringing up every spec's network at start (through the driver: for Docker the sandbox networks,
their firewall rules and the webhook listener on each gateway), in the background and retrying
while the runtime does not answer: sandboxes that outlived a restart of the control plane post
their webhooks again before any new start."""

from __future__ import annotations

import asyncio

import structlog

from controlplane.background import stop_task
from controlplane.sandboxes.launcher import network_policy
from controlplane.specs.catalog import SpecCatalog
from drivers.base import SandboxDriver
from drivers.errors import NetworkUnavailable, RuntimeUnavailable

log = structlog.get_logger(__name__)

RETRY_SECONDS = 5.0


class NetworkSetup:
    def __init__(self, driver: SandboxDriver, catalog: SpecCatalog) -> None:
        self._driver = driver
        self._catalog = catalog
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._prepare_all(), name="sandbox-networks")

    async def _prepare_all(self) -> None:
        policies = [network_policy(spec) for spec in self._catalog.all()]
        while True:
            try:
                await self._driver.prepare(policies)
                return
            except (RuntimeUnavailable, NetworkUnavailable) as exc:
                log.warning("sandbox_networks_not_ready", error=str(exc), retry_s=RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)

    async def close(self) -> None:
        await stop_task(self._task)
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception():
            # A thread of the driver may finish with its own error rather than see the
            # cancellation (e.g. a network removed by someone else meanwhile).
            log.warning("sandbox_networks_failed", error=str(task.exception()))
