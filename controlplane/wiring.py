"""The service graph: every long-lived object of the app, made and closed here and nowhere else.

Each resource opens and closes in one cleanup context, and create_app appends them in
dependency order (`contexts`); aiohttp opens them in that order and closes them in reverse:

1. redis          the Redis client, the secret box, and what needs only them (API keys, browser
                  sessions, the device flow, settings and LLM profiles, rate limiters)
2. runtime        the sandbox driver (for Docker with its networks and firewall) and the
                  webhook listener it binds where sandboxes reach it
3. http client    the one client session to agent servers and webhook receivers
4. runtime http   the client of what browser clients send to a sandbox (cloud proxy, reads)
5. lifecycle      the lifecycle webhook outbox and this replica's deliverer, the publisher
6. snapshot store with ACS_SNAPSHOT_STORE_URL: the registry's client, the snapshot records
                  and the users' keys (sandboxes started from a snapshot read through it)
7. sandboxes      the sandbox service with its launcher, readiness probe, status feed and leases,
                  the warm pool, the reconciler and the idle reaper
8. snapshots      the snapshot service (take, fork, delete) and the collector
9. LLM gateway    sandbox credentials, the users' gateway keys, forwarding (and the LiteLLM
                  translator process, started on first need), metering; without sandboxes it
                  serves the users' own gateway keys alone
10. conversations the conversation service with its start tasks (which hand agents gateway
                  credentials) and pending messages, events
11. proxy         the sandbox proxy's client and what it keeps between requests
12. webhooks      every spec's network made ready and the webhook listener serving: opened
                  after every service it calls exists, closed before they close (no webhook
                  arrives while the rest close)
13. handover      start tasks resumed from other (stopped or dead) replicas; closed first: at
                  shutdown this replica's starts finish or are handed over while webhooks still
                  arrive (controlplane/shutdown.py)

Each object gets what it works with through its constructor; nothing is patched in afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.agent_protocol.client import AgentClient
from controlplane.api.ratelimit import RateLimiter
from controlplane.auth.device import DeviceFlowConfig, DeviceFlowService
from controlplane.auth.service import ApiKeyService
from controlplane.auth.sessions import SIGNING_PURPOSE, SessionService
from controlplane.auth.tickets import TicketService
from controlplane.config import ServiceConfig
from controlplane.conversations.handover import StartTaskHandover
from controlplane.conversations.pending import PendingMessages
from controlplane.conversations.service import ConversationService
from controlplane.conversations.starter import StartTaskRunner
from controlplane.conversations.store import ConversationStore
from controlplane.crypto import check_shared_key, key_source, load_secret_box
from controlplane.events.service import EventService
from controlplane.events.store import EventStore
from controlplane.gateway.credentials import SandboxTokens, UserGatewayKeys
from controlplane.gateway.destinations import Destinations
from controlplane.gateway.forward import Forwarder
from controlplane.gateway.metrics import GatewayMetrics
from controlplane.gateway.service import GatewayService
from controlplane.gateway.translator_process import TranslatorProcess
from controlplane.lifecycle.outbox import Outbox
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.lifecycle.webhooks import DeliveryHooks, RetryPolicy, WebhookDeliverer
from controlplane.metrics import Metrics
from controlplane.proxy.state import ProxyState, proxy_client
from controlplane.sandboxes.admission import Admission
from controlplane.sandboxes.launcher import Launcher, network_policy
from controlplane.sandboxes.leases import IntentLeases
from controlplane.sandboxes.lifecycle import SandboxLifecycle
from controlplane.sandboxes.locks import SandboxLocks
from controlplane.sandboxes.network_setup import NetworkSetup
from controlplane.sandboxes.pool import WarmPool
from controlplane.sandboxes.pool_store import PoolStore
from controlplane.sandboxes.readiness import ReadinessProbe
from controlplane.sandboxes.reaper import IdleReaper
from controlplane.sandboxes.reconciler import Reconciler
from controlplane.sandboxes.runtime_http import RuntimeHttp
from controlplane.sandboxes.service import SandboxService
from controlplane.sandboxes.status_feed import StatusFeed
from controlplane.sandboxes.store import SandboxStore
from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.settings.profiles import LlmProfiles
from controlplane.settings.service import SettingsService
from controlplane.settings.store import UserRecordStore
from controlplane.snapshots.collector import Collector
from controlplane.snapshots.registry import Registry
from controlplane.snapshots.service import SnapshotService
from controlplane.snapshots.sources import SnapshotData
from controlplane.snapshots.store import SnapshotStore
from controlplane.snapshots.taker import Taker
from controlplane.store import keyspace
from controlplane.store.failover import open_redis
from controlplane.store.leader import LeaderLock
from controlplane.store.redis import wait_for_redis
from drivers.base import SandboxDriver
from drivers.docker import DockerDriver
from drivers.kube_options import Credentials, KubeOptions

Context = Callable[[web.Application], AsyncIterator[None]]


def contexts(
    config: ServiceConfig,
    *,
    with_sandboxes: bool,
    webhook_app: Callable[[web.Application], web.Application],
) -> list[Context]:
    """The cleanup contexts of an app, in the order they open. `webhook_app(app)` makes the
    webhook listener's application (create_webhook_app); without sandboxes only Redis."""
    if not with_sandboxes:
        return [redis_ctx(config), gateway_ctx(config)]
    return [
        redis_ctx(config),
        runtime_ctx(config),
        http_ctx(),
        runtime_http_ctx(),
        lifecycle_ctx(config),
        snapshot_store_ctx(config),
        sandboxes_ctx(config),
        snapshots_ctx(config),
        gateway_ctx(config),
        conversations_ctx(config),
        proxy_ctx(),
        webhooks_ctx(webhook_app),
        handover_ctx(),
    ]


def redis_ctx(config: ServiceConfig) -> Context:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        # The key first: a bad key must stop start-up before a Redis connection exists to leak.
        box = load_secret_box(config.secret_key, config.data_dir)
        client = await open_redis(config)  # Sentinel's master, the URL's, or the embedded one
        try:
            await wait_for_redis(client)
            source = key_source(config.secret_key, config.data_dir)
            await check_shared_key(client, keyspace.SECRET_KEY_CHECK, box, source)
        except BaseException:
            await client.aclose()
            raise
        app[keys.REDIS] = client
        app[keys.SECRET_BOX] = box
        api_keys = ApiKeyService(client, config.bootstrap_api_key, config.bootstrap_user)
        app[keys.API_KEYS] = api_keys
        app[keys.TICKETS] = TicketService(client)
        app[keys.SESSIONS] = SessionService(
            client, api_keys, box.derive_key(SIGNING_PURPOSE), config.session_ttl
        )
        app[keys.DEVICE_FLOW] = DeviceFlowService(
            client,
            api_keys,
            DeviceFlowConfig(ttl=config.device_code_ttl, interval=config.device_poll_interval),
        )
        app[keys.AUTH_LIMITER] = RateLimiter(client, config.auth_rate_limit_per_minute)
        records = UserRecordStore(client, box)
        app[keys.SETTINGS] = SettingsService(records)
        app[keys.PROFILES] = LlmProfiles(records)
        if config.rate_limit_per_minute:
            app[keys.RATE_LIMITER] = RateLimiter(client, config.rate_limit_per_minute)
        if config.webhook_rate_limit_per_minute:
            app[keys.WEBHOOK_LIMITER] = RateLimiter(client, config.webhook_rate_limit_per_minute)
        yield
        await client.aclose()

    return ctx


def runtime_ctx(config: ServiceConfig) -> Context:
    """The driver (ACS_DRIVER) and the webhook listener it binds where sandboxes reach it
    (Docker: its sandbox networks' gateways; Kubernetes: ACS_KUBE_WEBHOOK_ADDRESS), serving from
    `webhooks_ctx` on."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        listener = WebhookListener(config.webhook_port or 0)
        driver: SandboxDriver
        if config.driver == "kubernetes":
            driver = kubernetes_driver(config, listener, app[keys.METRICS])
        else:
            driver = DockerDriver(
                config.docker_url,
                prefix=config.container_prefix,
                threads=config.docker_threads,
                quick_threads=config.docker_quick_threads,
                address=config.url_host,
                publish_host=config.publish_host,
                memory_floor=config.host_memory_floor,
                listener=listener,
                firewall_mode=config.host_firewall,
                host_ports=config.sandbox_host_ports,
                subnet_pool=config.sandbox_subnet_pool,
                subnet_size=config.sandbox_subnet_size,
                on_error=app[keys.METRICS].docker_error,
                files_image=config.snapshot_helper_image or config.base_image,
            )
        app[keys.DRIVER] = driver
        app[keys.WEBHOOK_LISTENER] = listener
        yield
        await driver.close()

    return ctx


def kubernetes_driver(
    config: ServiceConfig, listener: WebhookListener, metrics: Metrics
) -> SandboxDriver:
    """The Kubernetes driver as ACS_KUBE_* configure it (docs/deployment.md); imported here
    only, as its client library takes a second to import."""
    from drivers.kubernetes import KubernetesDriver  # noqa: PLC0415 (see above)

    options = KubeOptions(
        namespace=config.kube_namespace,
        endpoint=config.kube_endpoint,
        control_plane_url=config.kube_control_plane_url,
        webhook_address=config.kube_webhook_address,
        control_plane_labels=dict(config.kube_control_plane_labels),
        control_plane_namespace=config.kube_control_plane_namespace,
        control_plane_cidrs=tuple(config.kube_control_plane_cidrs),
        host_ports=tuple(config.sandbox_host_ports),
        storage_class=config.kube_storage_class,
        workspace_size=config.kube_workspace_size,
        image_registry=config.kube_image_registry,
        image_pull_secrets=tuple(config.kube_image_pull_secrets),
        image_pull_policy=config.kube_image_pull_policy,
        runtime_classes=dict(config.kube_runtime_classes),
        node_selector=dict(config.kube_node_selector),
        cpu_request=config.kube_cpu_request,
        pause_grace=config.kube_pause_grace,
        schedule_timeout=config.kube_schedule_timeout,
        start_timeout=config.kube_pod_start_timeout,
        internet_except=tuple(config.kube_internet_except),
        dns_labels=dict(config.kube_dns_labels),
    )
    kubeconfig = str(config.kubeconfig) if config.kubeconfig else None
    return KubernetesDriver(
        options,
        prefix=config.container_prefix,
        credentials=Credentials(kubeconfig=kubeconfig, context=config.kube_context),
        listener=listener,
        on_error=metrics.kube_error,
        on_watch_restart=metrics.kube_watch_restarted,
    )


def http_ctx() -> Context:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        app[keys.HTTP_CLIENT] = http
        yield
        await http.close()

    return ctx


def runtime_http_ctx() -> Context:
    """The client of the requests browser clients have sent to a sandbox's agent server: a pool
    of its own, answers decompressed and bounded (sandboxes/runtime_http.py)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=50), auto_decompress=True
        ) as http:
            app[keys.RUNTIME_HTTP] = RuntimeHttp(http)
            yield

    return ctx


def lifecycle_ctx(config: ServiceConfig) -> Context:
    """The lifecycle publisher and, with ACS_LIFECYCLE_WEBHOOK_URLS, the webhook outbox and this
    replica's deliverer."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis = app[keys.REDIS]
        outbox: Outbox | None = None
        deliverer: WebhookDeliverer | None = None
        if config.lifecycle_webhook_urls:
            metrics = app[keys.METRICS]
            outbox = Outbox(redis, config.lifecycle_webhook_urls)
            deliverer = WebhookDeliverer(
                outbox,
                app[keys.HTTP_CLIENT],
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
            app[keys.WEBHOOK_OUTBOX] = outbox
            deliverer.start()
        app[keys.LIFECYCLE] = LifecyclePublisher(redis, outbox)
        yield
        if deliverer is not None:
            await deliverer.close()

    return ctx


def sandboxes_ctx(config: ServiceConfig) -> Context:
    """The sandbox service and the background loops that keep sandboxes right: the reconciler,
    the warm pool's refiller and the idle reaper."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis, driver, catalog = app[keys.REDIS], app[keys.DRIVER], app[keys.SPECS]
        probe = ReadinessProbe(app[keys.HTTP_CLIENT], driver, config.start_timeout)
        feed = StatusFeed(redis, on_listening=probe.hint)
        store = SandboxStore(
            redis,
            app[keys.SECRET_BOX],
            on_change=feed.notify,
            paused_holds_memory=not driver.pause_releases,
        )
        notes = SandboxLifecycle(app[keys.LIFECYCLE])
        leases = IntentLeases(redis)
        locks = SandboxLocks()
        admission = Admission(config, driver)
        launcher = Launcher(
            config,
            store,
            driver=driver,
            catalog=catalog,
            probe=probe,
            notes=notes,
            leases=leases,
            webhooks=True,  # the driver binds the webhook listener where sandboxes reach it
            restores=app.get(keys.SNAPSHOT_DATA),
        )
        pool = WarmPool(
            config,
            PoolStore(redis, store),
            store,
            driver,
            catalog,
            launcher=launcher,
            locks=locks,
            admission=admission,
            leader=LeaderLock(redis, keyspace.leader("pool"), max(3 * config.pool_interval, 5.0)),
        )
        service = SandboxService(
            config,
            store,
            driver,
            catalog,
            launcher=launcher,
            locks=locks,
            admission=admission,
            probe=probe,
            feed=feed,
            notes=notes,
            leases=leases,
            pool=pool,
            restores=app.get(keys.SNAPSHOT_DATA),
        )
        reconciler = Reconciler(
            config,
            store,
            driver,
            catalog,
            deletes=service,
            launcher=launcher,
            locks=locks,
            notes=notes,
            leases=leases,
            on_fix=app[keys.METRICS].reconcile_fixed,
        )
        reaper = IdleReaper(
            config,
            store,
            catalog,
            actions=service,
            activity=ConversationStore(redis),
            settings=app[keys.SETTINGS],
            leader=LeaderLock(redis, keyspace.leader("reaper"), 3 * config.reaper_interval),
        )
        app[keys.SANDBOXES] = service
        app[keys.POOL] = pool
        app[keys.RECONCILER] = reconciler
        app[keys.REAPER] = reaper
        feed.start()
        reconciler.start()
        reaper.start()
        pool.start()
        yield
        await pool.stop()
        await reaper.stop()
        await reconciler.stop()
        # In-process launches stop; their leases are released, so the next sweep (of this or
        # another replica) carries their starts on.
        await launcher.close()
        await leases.close()
        await probe.close()
        await feed.stop()

    return ctx


def snapshot_store_ctx(config: ServiceConfig) -> Context:
    """With ACS_SNAPSHOT_STORE_URL: the snapshot store's client (the OCI registry, on the one
    HTTP client), its records and the users' keys, which sandboxes started from a snapshot
    read their files through."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if config.snapshot_store_url is not None:
            registry = Registry(
                app[keys.HTTP_CLIENT],
                config.snapshot_store_url,
                username=config.snapshot_store_username,
                password=config.snapshot_store_password,
                timeout=config.snapshot_store_timeout,
            )
            app[keys.SNAPSHOT_DATA] = SnapshotData(
                SnapshotStore(app[keys.REDIS]),
                registry,
                app[keys.SECRET_BOX],
                config.snapshot_store_repository,
            )
        yield

    return ctx


def snapshots_ctx(config: ServiceConfig) -> Context:
    """The snapshot service (above sandboxes) and its collector, with a store."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        data = app.get(keys.SNAPSHOT_DATA)
        if data is None:
            yield
            return
        sandboxes = app[keys.SANDBOXES]
        taker = Taker(
            data,
            sandboxes.store,
            lease=config.snapshot_lease,
            pack_bytes=config.snapshot_pack_bytes,
        )
        service = SnapshotService(config, data, sandboxes, taker, app[keys.DRIVER].files)
        collector = Collector(
            config,
            data,
            sandboxes.store,
            remove=service.remove,
            files=app[keys.DRIVER].files,
            leader=LeaderLock(
                app[keys.REDIS],
                keyspace.leader("snapshots"),
                max(3 * config.snapshot_collect_interval, 10.0),
            ),
        )
        app[keys.SNAPSHOTS] = service
        app[keys.COLLECTOR] = collector
        collector.start()
        yield
        await collector.stop()
        await service.close()

    return ctx


def gateway_ctx(config: ServiceConfig) -> Context:
    """The LLM gateway. Its translator's socket lives in a private directory (0700) of its
    own, short enough for AF_UNIX; the process starts on the first call that needs LiteLLM."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        driver = app.get(keys.DRIVER)

        async def host_address() -> str | None:
            """This host as the default spec's sandboxes reach it (host.docker.internal)."""
            if driver is None:
                return None
            return await driver.host_address(network_policy(app[keys.SPECS].default))

        run_dir = Path(tempfile.mkdtemp(prefix="acs-llm-"))
        translator = TranslatorProcess(run_dir)
        forwarder = Forwarder(
            Destinations(lambda: config.sandbox_host_ports, host_address),
            translator,
            timeout=config.llm_gateway_timeout,
            retries=config.llm_gateway_retries,
            backoff=config.llm_gateway_backoff,
        )
        box = app[keys.SECRET_BOX]
        gateway = GatewayService(
            config,
            app[keys.REDIS],
            box,
            tokens=SandboxTokens(box),
            user_keys=UserGatewayKeys(app[keys.REDIS], box),
            forwarder=forwarder,
            metrics=GatewayMetrics(app[keys.METRICS].registry),
        )
        app[keys.GATEWAY] = gateway
        yield
        await gateway.close()
        await forwarder.close()
        await translator.close()
        shutil.rmtree(run_dir, ignore_errors=True)

    return ctx


def conversations_ctx(config: ServiceConfig) -> Context:
    """Conversations (their start tasks, recovered here after a restart) and events."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis, sandboxes, publisher = app[keys.REDIS], app[keys.SANDBOXES], app[keys.LIFECYCLE]
        store = ConversationStore(redis)
        events = EventStore(redis)
        agent = AgentClient(app[keys.HTTP_CLIENT])
        pending = PendingMessages(redis, sandboxes, agent)
        runner = StartTaskRunner(
            config,
            store,
            sandboxes,
            app[keys.SETTINGS],
            agent,
            catalog=app[keys.SPECS],
            publisher=publisher,
            pending=pending,
            gateway_tokens=app[keys.GATEWAY].tokens,
            gateway_url=sandboxes.launcher.control_plane_url,
        )
        conversations = ConversationService(
            store, events, sandboxes, agent, runner, publisher=publisher, pending=pending
        )
        event_service = EventService(
            events,
            conversations,
            records=store,
            sandboxes=sandboxes,
            catalog=app[keys.SPECS],
            agent=agent,
            url_host=config.url_host,
            on_lag=app[keys.METRICS].event_delivered,
        )
        app[keys.CONVERSATIONS] = conversations
        app[keys.EVENTS] = event_service
        yield
        await event_service.close()
        await conversations.close()

    return ctx


def proxy_ctx() -> Context:
    """The sandbox proxy's client (its own: no decompression, no connection limit) and what it
    keeps between requests; any change of a sandbox forgets the access granted to it and its
    address, a status feed that was down forgets everything (and nothing cached is used while
    it is down)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        feed = app[keys.SANDBOXES].feed
        state = ProxyState(proxy_client(), synced=lambda: feed.synced)
        feed.subscribe(state.forget, reset=state.forget_all)
        app[keys.PROXY] = state

        async def close_sockets(_app: web.Application) -> None:
            await state.close_sockets()  # before the server waits for its handlers to end

        app.on_shutdown.append(close_sockets)
        yield
        await state.http.close()

    return ctx


def webhooks_ctx(webhook_app: Callable[[web.Application], web.Application]) -> Context:
    """The webhook listener, bound by the driver on each sandbox network's gateway as the
    networks come up (in the background: sandboxes that outlived a restart post their webhooks
    before any new start)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        listener = app[keys.WEBHOOK_LISTENER]
        listener.attach(webhook_app(app))
        setup = NetworkSetup(app[keys.DRIVER], app[keys.SPECS])
        setup.start()
        yield
        await setup.close()
        await listener.close()

    return ctx


def handover_ctx() -> Context:
    """Start tasks outlive their replica (controlplane/conversations/handover.py): the ones
    waiting are resumed before serving, and others' orphans adopted as they appear. Closed first,
    while the webhook listener still serves the starts' readiness: this replica's starts get
    what is left of ACS_SHUTDOWN_TIMEOUT after SIGTERM, then are handed over."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        handover = await StartTaskHandover.started(app[keys.CONVERSATIONS].runner)
        yield
        await handover.drain(app[keys.DRAIN].left(), app[keys.SANDBOXES].launcher)

    return ctx
