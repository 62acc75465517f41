"""Opens and closes the Docker driver and the services that need it: sandboxes, the reconciler,
conversations and events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.conversations.agent_client import AgentClient
from controlplane.conversations.service import ConversationService
from controlplane.conversations.starter import StartTaskRunner
from controlplane.conversations.store import ConversationStore
from controlplane.events.service import EventService
from controlplane.events.store import EventStore
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
        conversation_store = ConversationStore(app[keys.REDIS])
        agent = AgentClient(http)
        runner = StartTaskRunner(config, conversation_store, service, app[keys.SETTINGS], agent)
        conversations = ConversationService(
            conversation_store, EventStore(app[keys.REDIS]), service, agent, runner
        )
        app[keys.CONVERSATIONS] = conversations
        app[keys.EVENTS] = EventService(conversations.events, conversations)
        await runner.recover()
        reconciler.start()
        yield
        await reconciler.stop()
        await conversations.close()
        await service.close()
        await http.close()
        await driver.close()

    return ctx
