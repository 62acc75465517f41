"""Opens and closes the Docker driver, the sandbox service and the reconciler."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.sandboxes.launcher import HealthProbe
from controlplane.sandboxes.reconciler import Reconciler
from controlplane.sandboxes.service import SandboxService
from controlplane.sandboxes.store import SandboxStore
from drivers.docker import DockerDriver

RECONCILER: web.AppKey[Reconciler] = web.AppKey("reconciler")


def sandbox_ctx(config: ServiceConfig) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        catalog = app[keys.SPECS]
        driver = DockerDriver(config.docker_url, threads=config.docker_threads)
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        probe = HealthProbe(http, driver, config.url_host, config.start_timeout)
        store = SandboxStore(app[keys.REDIS], app[keys.SECRET_BOX])
        service = SandboxService(config, store, driver, catalog, probe)
        reconciler = Reconciler(service, config.reconcile_interval)
        app[keys.SANDBOXES] = service
        app[RECONCILER] = reconciler
        reconciler.start()
        yield
        await reconciler.stop()
        await service.close()
        await http.close()
        await driver.close()

    return ctx
