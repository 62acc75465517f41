"""Opens and closes the Docker driver and the services that need it: sandboxes, the reconciler,
conversations and events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.conversations.agent_client import AgentClient
from controlplane.conversations.handover import StartTaskHandover
from controlplane.conversations.pending import PendingMessages
from controlplane.conversations.service import ConversationService
from controlplane.conversations.starter import StartTaskRunner
from controlplane.conversations.store import ConversationStore
from controlplane.events.service import EventService
from controlplane.events.store import EventStore
from controlplane.lifecycle.outbox import Outbox
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.lifecycle.webhooks import DeliveryHooks, RetryPolicy, WebhookDeliverer
from controlplane.metrics import METRICS
from controlplane.sandboxes.leases import IntentLeases
from controlplane.sandboxes.networking import SandboxNetworks
from controlplane.sandboxes.pool import WarmPool
from controlplane.sandboxes.pool_store import PoolStore
from controlplane.sandboxes.readiness import ReadinessProbe
from controlplane.sandboxes.reaper import IdleReaper
from controlplane.sandboxes.reconciler import Reconciler
from controlplane.sandboxes.service import SandboxService
from controlplane.sandboxes.status_feed import StatusFeed
from controlplane.sandboxes.store import SandboxStore
from controlplane.shutdown import DRAIN
from controlplane.store import keys as store_keys
from controlplane.store.leader import LeaderLock
from drivers.docker import DockerDriver

RECONCILER: web.AppKey[Reconciler] = web.AppKey("reconciler")
POOL: web.AppKey[WarmPool] = web.AppKey("warm_pool")
REAPER: web.AppKey[IdleReaper] = web.AppKey("reaper")


def _webhooks(
    config: ServiceConfig, app: web.Application, http: aiohttp.ClientSession
) -> tuple[Outbox | None, WebhookDeliverer | None]:
    """The lifecycle webhook outbox and this replica's deliverer, started (none without URLs)."""
    if not config.lifecycle_webhook_urls:
        return None, None
    metrics = app[METRICS]
    outbox = Outbox(app[keys.REDIS], config.lifecycle_webhook_urls)
    deliverer = WebhookDeliverer(
        outbox,
        http,
        config.lifecycle_webhook_secret,
        RetryPolicy(
            base=config.lifecycle_webhook_retry_base,
            cap=config.lifecycle_webhook_retry_max,
            dead_after=config.lifecycle_webhook_dead_after,
            timeout=config.lifecycle_webhook_timeout,
        ),
        hooks=DeliveryHooks(
            delivered=metrics.webhook_delivered.inc,
            retried=metrics.webhook_retried.inc,
            dead_lettered=metrics.webhook_dead_lettered.inc,
        ),
    )
    deliverer.start()
    metrics.webhook_outbox = outbox
    app[keys.WEBHOOK_OUTBOX] = outbox
    return outbox, deliverer


def sandbox_ctx(config: ServiceConfig) -> Callable[[web.Application], AsyncIterator[None]]:  # noqa: PLR0915 (one statement over; issue 21 moves this wiring)
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        catalog = app[keys.SPECS]
        metrics = app[METRICS]
        driver = DockerDriver(
            config.docker_url,
            threads=config.docker_threads,
            quick_threads=config.docker_quick_threads,
            on_error=metrics.docker_error,
        )
        try:
            networks = SandboxNetworks(config, driver, catalog)
        except BaseException:
            await driver.close()
            raise
        app[keys.NETWORKS] = networks
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        probe = ReadinessProbe(http, driver, config.url_host, config.start_timeout)
        store = SandboxStore(app[keys.REDIS], app[keys.SECRET_BOX])
        outbox, deliverer = _webhooks(config, app, http)
        publisher = LifecyclePublisher(app[keys.REDIS], outbox)
        app[keys.LIFECYCLE] = publisher
        feed = StatusFeed(app[keys.REDIS])
        service = SandboxService(
            config,
            store,
            driver,
            catalog,
            probe,
            publisher=publisher,
            networks=networks,
            leases=IntentLeases(app[keys.REDIS]),
            feed=feed,
        )
        reconciler = Reconciler(service, config.reconcile_interval)
        app[keys.SANDBOXES] = service
        app[RECONCILER] = reconciler
        conversation_store = ConversationStore(app[keys.REDIS])
        agent = AgentClient(http)
        pending = PendingMessages(app[keys.REDIS], service, agent)
        runner = StartTaskRunner(
            config,
            conversation_store,
            service,
            app[keys.SETTINGS],
            agent,
            publisher=publisher,
            pending=pending,
        )
        conversations = ConversationService(
            conversation_store, EventStore(app[keys.REDIS]), service, agent, runner, pending=pending
        )
        reaper = IdleReaper(
            service,
            conversation_store,
            app[keys.SETTINGS],
            LeaderLock(app[keys.REDIS], store_keys.leader("reaper"), 3 * config.reaper_interval),
        )
        app[REAPER] = reaper
        pool = WarmPool(
            service,
            PoolStore(app[keys.REDIS], store),
            LeaderLock(
                app[keys.REDIS], store_keys.leader("pool"), max(3 * config.pool_interval, 5.0)
            ),
        )
        service.pool = pool
        app[POOL] = pool
        app[keys.CONVERSATIONS] = conversations
        app[keys.EVENTS] = EventService(
            conversations.events, conversations, on_lag=metrics.event_delivered
        )
        feed.start()
        handover = await StartTaskHandover.started(runner)
        reconciler.start()
        reaper.start()
        pool.start()
        yield
        # Starts finish or are handed over first: they need the webhook listener (readiness).
        await handover.drain(app[DRAIN].left(), service.launcher)
        await networks.close()  # no webhooks arrive while the services below close
        await pool.stop()
        await app[keys.EVENTS].close()
        await reaper.stop()
        await reconciler.stop()
        await conversations.close()
        if deliverer is not None:
            await deliverer.close()
        await service.close()  # its launches, leases, readiness loop and status feed
        await http.close()
        await driver.close()

    return ctx
