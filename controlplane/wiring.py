"""The service graph: every long-lived object of the app, made and closed here and nowhere else.

Each resource opens and closes in one cleanup context, and create_app appends them in
dependency order (`contexts`); aiohttp opens them in that order and closes them in reverse:

1. redis          the Redis client, the secret box, and what needs only them (API keys,
                  organizations (their migration runs here, once), browser sessions and the
                  OpenID sign-in, the device flow, settings and LLM profiles, rate limiters)
2. runtime        the sandbox driver of the runtime ACS_DRIVER names (drivers/runtimes.py) and
                  the webhook listener it binds where sandboxes reach it
3. http client    the one client session to agent servers
4. runtime http   the client of what browser clients send to a sandbox (cloud proxy, reads)
5. outbound       the outbound policies of connections made for users and to the operator's
                  URLs, read from the driver, Redis and the other replicas, kept current
6. lifecycle      the lifecycle webhook outbox and this replica's deliverer, the publisher
7. snapshot store with ACS_SNAPSHOT_STORE_URL: the registry's client, the snapshot records
                  and the users' keys (sandboxes started from a snapshot read through it)
8. sandboxes      the sandbox service with its launcher, readiness probe, status feed and leases,
                  the warm pool, the reconciler and the idle reaper
9. snapshots      the snapshot service (take, fork, delete) and the collector
10. LLM gateway   sandbox credentials, the users' gateway keys, forwarding (and the LiteLLM
                  translator process, started on first need), metering; without sandboxes it
                  serves the users' own gateway keys alone
11. conversations the conversation service with its start tasks (which hand agents gateway
                  credentials) and pending messages, events; with snapshots, the checkpoints
                  taken at users' messages and their service (rewind, fork)
12. proxy         the sandbox proxy's client and what it keeps between requests
13. webhooks      every spec's network made ready and the webhook listener serving: opened
                  after every service it calls exists, closed before they close (no webhook
                  arrives while the rest close)
14. handover      start tasks resumed from other (stopped or dead) replicas; closed first: at
                  shutdown this replica's starts finish or are handed over while webhooks still
                  arrive (controlplane/shutdown.py)

Each object gets what it works with through its constructor; nothing is patched in afterwards.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.agent_protocol.client import AgentClient
from controlplane.api.ratelimit import RateLimiter
from controlplane.audit.search import CURSOR_PURPOSE, AuditSearch
from controlplane.audit.sinks import StdoutSink, audit_log, sink_outbox, summarize_dropped
from controlplane.auth.device import DeviceFlowConfig, DeviceFlowService
from controlplane.auth.oidc import OidcClient, OidcSettings
from controlplane.auth.oidc_flow import SignInFlow
from controlplane.auth.oidc_recheck import SessionRecheck
from controlplane.auth.service import ApiKeyService
from controlplane.auth.sessions import SIGNING_PURPOSE, SessionService
from controlplane.auth.tickets import TicketService
from controlplane.background import stop_task
from controlplane.checkpoints.service import CheckpointService
from controlplane.checkpoints.store import CheckpointStore
from controlplane.checkpoints.taking import Checkpointer
from controlplane.config import ServiceConfig
from controlplane.conversations.handover import StartTaskHandover
from controlplane.conversations.indexes import migrate_in_background as index_conversations
from controlplane.conversations.pending import PendingMessages
from controlplane.conversations.service import ConversationService
from controlplane.conversations.starter import StartTaskRunner
from controlplane.conversations.store import ConversationStore, reindex_in_background
from controlplane.conversations.task_index import migrate_in_background
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
from controlplane.organizations.groups import GroupRoles
from controlplane.organizations.migration import migrate
from controlplane.organizations.service import OrganizationService
from controlplane.organizations.store import OrganizationStore
from controlplane.outbound.client import OutboundClient
from controlplane.outbound.sources import OutboundSources
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
from controlplane.sandboxes.start_gate import StartGate
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
from controlplane.store.audit_backfill import AuditBackfill, backfill_in_background
from controlplane.store.audit_index import AuditIndexer
from controlplane.store.failover import open_redis
from controlplane.store.leader import LeaderLock
from controlplane.store.redis import wait_for_redis
from drivers.runtime import RuntimeHost
from drivers.runtimes import RUNTIMES

Context = Callable[[web.Application], AsyncIterator[None]]


def contexts(
    config: ServiceConfig,
    *,
    with_sandboxes: bool,
    webhook_app: Callable[[web.Application], web.Application],
    translator: TranslatorProcess | None = None,
) -> list[Context]:
    """The cleanup contexts of an app, in the order they open. `webhook_app(app)` makes the
    webhook listener's application (create_webhook_app); without sandboxes only Redis.
    `translator`: see gateway_ctx."""
    if not with_sandboxes:
        return [
            redis_ctx(config),
            outbound_ctx(config),
            audit_ctx(config),
            gateway_ctx(config, translator),
        ]
    return [
        redis_ctx(config),
        runtime_ctx(config),
        http_ctx(),
        runtime_http_ctx(),
        outbound_ctx(config),
        audit_ctx(config),
        lifecycle_ctx(config),
        snapshot_store_ctx(config),
        sandboxes_ctx(config),
        snapshots_ctx(config),
        gateway_ctx(config, translator),
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
        organizations = OrganizationService(OrganizationStore(client), config.default_organization)
        await migrate(client, organizations)
        app[keys.ORGANIZATIONS] = organizations
        sign_in(app, config, api_keys, organizations)
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


def sign_in(
    app: web.Application,
    config: ServiceConfig,
    api_keys: ApiKeyService,
    organizations: OrganizationService,
) -> None:
    """Browser sessions and, with ACS_OIDC_ISSUER, sign-in through the OpenID provider (its
    sessions checked with it every ACS_OIDC_RECHECK_INTERVAL, the groups applied to the user's
    organizations at each sign-in and check)."""
    redis, box = app[keys.REDIS], app[keys.SECRET_BOX]
    signing_key = box.derive_key(SIGNING_PURPOSE)
    if config.oidc_issuer is None or config.oidc_client_id is None:
        app[keys.SESSIONS] = SessionService(redis, api_keys, signing_key, config.session_ttl)
        return
    client = OidcClient(
        OidcSettings(
            issuer=config.oidc_issuer,
            client_id=config.oidc_client_id,
            client_secret=config.oidc_client_secret,
            scopes=tuple(config.oidc_scopes),
            user_claim=config.oidc_user_claim,
            groups_claim=config.oidc_groups_claim,
            auth_params=dict(config.oidc_auth_params),
            timeout=config.oidc_timeout,
        )
    )
    groups = GroupRoles(organizations, config.oidc_group_roles, config.oidc_default_role)
    interval = config.oidc_recheck_interval
    recheck = SessionRecheck(redis, client, api_keys, box, groups, interval=interval)
    sessions = SessionService(redis, api_keys, signing_key, config.session_ttl, recheck)
    app[keys.SESSIONS] = sessions
    app[keys.OIDC_SIGN_IN] = SignInFlow(
        redis,
        client,
        sessions=sessions,
        api_keys=api_keys,
        box=box,
        memberships=groups,
        recheck_interval=interval,
    )


def runtime_ctx(config: ServiceConfig) -> Context:
    """The driver of the runtime ACS_DRIVER names (a row of drivers/runtimes.py, made from its
    own settings) and the webhook listener it binds where sandboxes reach it (Docker: its sandbox
    networks' gateways; Kubernetes: ACS_KUBE_WEBHOOK_ADDRESS), serving from `webhooks_ctx` on."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        listener = WebhookListener(config.webhook_port or 0)
        host = RuntimeHost(
            prefix=config.container_prefix,
            url_host=config.url_host,
            host_ports=tuple(config.sandbox_host_ports),
            listener=listener,
            counters=app[keys.METRICS].runtime_counter,
            helper_image=config.snapshot_helper_image or config.base_image,
        )
        driver = RUNTIMES[config.driver].make(config.runtime, host)
        app[keys.DRIVER] = driver
        app[keys.WEBHOOK_LISTENER] = listener
        yield
        await driver.close()

    return ctx


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


def outbound_ctx(config: ServiceConfig) -> Context:
    """The outbound policies, their inputs read once before anything connects with them, then
    every half minute (controlplane/outbound/sources.py)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        driver = app.get(keys.DRIVER)
        sources = OutboundSources(
            config, app[keys.REDIS], driver.sandbox_networks if driver is not None else None
        )
        await sources.refresh()
        sources.start()
        app[keys.OUTBOUND] = sources
        yield
        await sources.stop()

    return ctx


def audit_ctx(config: ServiceConfig) -> Context:
    """The audit log (written through the scope the audit middleware opens), its search, this
    replica's deliverers to the sinks (ACS_AUDIT_SINK_URLS through the outbound policy of the
    operator's URLs; ACS_AUDIT_STDOUT), this replica's indexer (store/audit_index.py: every
    replica runs one) and the backfill of the per-organization indexes
    (store/audit_backfill.py: in the background, until done by one replica)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis = app[keys.REDIS]
        app[keys.AUDIT_LOG] = audit_log(config, redis)
        app[keys.AUDIT_SEARCH] = AuditSearch(redis, app[keys.SECRET_BOX].derive_key(CURSOR_PURPOSE))
        http = OutboundClient(app[keys.OUTBOUND].operator)
        deliverer: WebhookDeliverer | None = None
        if config.audit_sink_urls:
            deliverer = WebhookDeliverer(
                sink_outbox(redis, config.audit_sink_urls),
                http,
                config.audit_sink_secret,
                RetryPolicy(
                    base=config.lifecycle_webhook_retry_base,
                    cap=config.lifecycle_webhook_retry_max,
                    dead_after=config.lifecycle_webhook_dead_after,
                    timeout=config.lifecycle_webhook_timeout,
                ),
            )
            deliverer.start()
        printer = StdoutSink(redis) if config.audit_stdout else None
        if printer is not None:
            printer.start()
        summaries = asyncio.create_task(
            summarize_dropped(app[keys.AUDIT_LOG]), name="audit_dropped_summaries"
        )
        indexer = asyncio.create_task(
            AuditIndexer(redis, retention=config.audit_retention).run(), name="audit_indexer"
        )
        # Entries from before the per-organization indexes get theirs (once per deployment).
        backfill = asyncio.create_task(
            backfill_in_background(AuditBackfill(redis, retention=config.audit_retention)),
            name="audit_backfill",
        )
        yield
        await stop_task(backfill)
        await stop_task(indexer)
        await stop_task(summaries)
        if printer is not None:
            await printer.close()
        if deliverer is not None:
            await deliverer.close()
        await http.close()

    return ctx


def lifecycle_ctx(config: ServiceConfig) -> Context:
    """The lifecycle publisher and, with ACS_LIFECYCLE_WEBHOOK_URLS, the webhook outbox and this
    replica's deliverer."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis = app[keys.REDIS]
        outbox: Outbox | None = None
        deliverer: WebhookDeliverer | None = None
        # The operator's receivers: no redirect, the address connected to the one checked.
        http = OutboundClient(app[keys.OUTBOUND].operator)
        if config.lifecycle_webhook_urls:
            metrics = app[keys.METRICS]
            outbox = Outbox(redis, config.lifecycle_webhook_urls)
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
            app[keys.WEBHOOK_OUTBOX] = outbox
            deliverer.start()
        app[keys.LIFECYCLE] = LifecyclePublisher(redis, outbox)
        yield
        if deliverer is not None:
            await deliverer.close()
        await http.close()

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
        admission = Admission(config, driver, app[keys.ORGANIZATIONS])
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
            gate=StartGate.of(config, boots_here=RUNTIMES[config.driver].boots_here),
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
            max_changed_bytes=config.snapshot_max_changed_bytes or None,
            settle=config.snapshot_upload_settle,
        )
        service = SnapshotService(config, data, sandboxes, taker, app[keys.DRIVER].files)
        collector = Collector(
            config,
            data,
            sandboxes.store,
            remove=service.remove,
            withdraw=sandboxes.withdraw,
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


def gateway_ctx(config: ServiceConfig, shared: TranslatorProcess | None = None) -> Context:
    """The LLM gateway. Its translator's socket lives in a private directory (0700) of its
    own, short enough for AF_UNIX; the process starts on the first call that needs LiteLLM.
    `shared`: a translator its owner started for several apps of one process (the test
    suite's workers, which would otherwise import LiteLLM once per app) and stops itself."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        driver = app.get(keys.DRIVER)

        async def host_address() -> str | None:
            """This host as the default spec's sandboxes reach it (host.docker.internal)."""
            if driver is None:
                return None
            return await driver.host_address(network_policy(app[keys.SPECS].default))

        own: Path | None = None  # the translator's directory, when the translator is its own
        if shared is not None:
            translator = shared
        else:
            own = Path(tempfile.mkdtemp(prefix="acs-llm-"))
            translator = TranslatorProcess(own, config.llm_translator_memory_bytes)
        forwarder = Forwarder(
            Destinations(app[keys.OUTBOUND], host_address),
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
        if own is not None:
            await translator.close()
            shutil.rmtree(own, ignore_errors=True)

    return ctx


def conversations_ctx(config: ServiceConfig) -> Context:
    """Conversations (their start tasks, recovered here after a restart) and events."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        redis, sandboxes, publisher = app[keys.REDIS], app[keys.SANDBOXES], app[keys.LIFECYCLE]
        # The events WebSocket's reads block (XREAD BLOCK, seconds each) and hold a connection
        # while they do: on a pool of their own, so that a crowd of watchers cannot take every
        # connection the requests need (store/pool.py).
        reader = await open_redis(config)
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
            organizations=app[keys.ORGANIZATIONS],
        )
        snapshots = app.get(keys.SNAPSHOTS)
        checkpoint_store = CheckpointStore(redis)
        checkpointer = (
            None
            if snapshots is None
            else Checkpointer(
                config,
                checkpoint_store,
                snapshots,
                events=events,
                conversations=store,
                settings=app[keys.SETTINGS],
                catalog=app[keys.SPECS],
            )
        )
        conversations = ConversationService(
            store,
            events,
            sandboxes,
            agent,
            runner,
            publisher=publisher,
            pending=pending,
            runtime=app[keys.RUNTIME_HTTP],
            checkpoints=checkpointer,
        )
        event_service = EventService(
            events,
            conversations,
            records=store,
            sandboxes=sandboxes,
            catalog=app[keys.SPECS],
            agent=agent,
            url_host=config.url_host,
            reader=reader,
            tickets=app[keys.TICKETS],
            on_lag=app[keys.METRICS].event_delivered,
        )
        app[keys.CONVERSATIONS] = conversations
        app[keys.EVENTS] = event_service
        # The /metrics gauge's status sets, built or put right once per start (see there).
        reindex = asyncio.create_task(reindex_in_background(store), name="conversation_statuses")
        # Start tasks written before their indexes existed: put in them once per deployment.
        task_indexes = asyncio.create_task(
            migrate_in_background(store.task_indexes), name="start_task_indexes"
        )
        # Conversations written before their indexes by creation and by title's trigrams.
        conversation_indexes = asyncio.create_task(
            index_conversations(store.indexes), name="conversation_indexes"
        )
        if checkpointer is not None and snapshots is not None:
            app[keys.CHECKPOINTER] = checkpointer
            app[keys.CHECKPOINTS] = CheckpointService(
                checkpoint_store,
                conversations,
                records=store,
                events=events,
                sandboxes=sandboxes,
                snapshots=snapshots,
            )
        yield
        await stop_task(reindex)
        await stop_task(task_indexes)
        await stop_task(conversation_indexes)
        await event_service.close()
        await conversations.close()
        if checkpointer is not None:
            await checkpointer.close()
        await reader.aclose()

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
        await state.close()

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
