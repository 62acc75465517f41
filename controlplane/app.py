"""The application factory: wires middlewares, routes and every service's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from controlplane import keys
from controlplane.api import parser_errors
from controlplane.api.cors import cors_middleware
from controlplane.api.durability import durable_middleware
from controlplane.api.middlewares import (
    PACER,
    RATE_LIMITER,
    WEBHOOK_LIMITER,
    auth_middleware,
    context_middleware,
    error_middleware,
    lift_deadline,
    pacing_middleware,
    rate_limit_middleware,
    size_limit_middleware,
    timeout_middleware,
    webhook_auth_middleware,
)
from controlplane.api.openapi import build_openapi
from controlplane.api.pacing import Pacer
from controlplane.api.ratelimit import RateLimiter
from controlplane.api.routing import RouteTable
from controlplane.auth.device import DeviceFlowConfig, DeviceFlowService
from controlplane.auth.oauth import routes as oauth_routes
from controlplane.auth.routes import routes as user_routes
from controlplane.auth.service import ApiKeyService
from controlplane.auth.sessions import SIGNING_PURPOSE, SessionService
from controlplane.auth.web import routes as sign_in_routes
from controlplane.config import ServiceConfig
from controlplane.conversations.legacy import routes as legacy_conversation_routes
from controlplane.conversations.pending_routes import routes as pending_routes
from controlplane.conversations.routes import routes as conversation_routes
from controlplane.crypto import load_secret_box
from controlplane.events.routes import routes as event_routes
from controlplane.events.routes import track_sockets
from controlplane.events.routes import webhook_routes as event_webhook_routes
from controlplane.health import OPENAPI_DOC
from controlplane.health import routes as health_routes
from controlplane.lifecycle.routes import routes as lifecycle_routes
from controlplane.metrics import METRICS, Metrics
from controlplane.proxy.routes import proxy_ctx
from controlplane.proxy.routes import routes as proxy_routes
from controlplane.sandboxes.agent_webhooks import webhook_routes as agent_webhook_routes
from controlplane.sandboxes.pool_routes import routes as pool_routes
from controlplane.sandboxes.routes import routes as sandbox_routes
from controlplane.sandboxes.wiring import RECONCILER, sandbox_ctx
from controlplane.settings.routes import routes as settings_routes
from controlplane.settings.service import SettingsService
from controlplane.settings.store import UserRecordStore
from controlplane.shutdown import DRAIN, Drain
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.routes import routes as spec_routes
from controlplane.store.failover import open_redis
from controlplane.store.redis import wait_for_redis
from controlplane.webclient.routes import routes as web_client_routes

VERSION = "0.1.0"


def route_tables() -> list[RouteTable]:
    """Every route group the API serves, in the order the OpenAPI document lists them."""
    return [
        health_routes,
        user_routes,
        sign_in_routes,
        oauth_routes,
        settings_routes,
        spec_routes,
        sandbox_routes,
        pool_routes,
        conversation_routes,
        legacy_conversation_routes,
        pending_routes,
        event_routes,
        *webhook_route_tables(),
        lifecycle_routes,
        web_client_routes,
        proxy_routes,
    ]


def webhook_route_tables() -> list[RouteTable]:
    """The routes sandboxes call: served by the API and, alone, by the webhook listener on the
    sandbox networks' gateways (create_webhook_app)."""
    return [event_webhook_routes, agent_webhook_routes]


def _redis_ctx(config: ServiceConfig) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        # The key first: a bad key must stop start-up before a Redis connection exists to leak.
        box = load_secret_box(config.secret_key, config.data_dir)
        client = await open_redis(config)
        try:
            await wait_for_redis(client)
        except BaseException:
            await client.aclose()
            raise
        app[keys.REDIS] = client
        app[keys.SECRET_BOX] = box
        api_keys = ApiKeyService(client, config.bootstrap_api_key, config.bootstrap_user)
        app[keys.API_KEYS] = api_keys
        app[keys.SESSIONS] = SessionService(
            client, api_keys, box.derive_key(SIGNING_PURPOSE), config.session_ttl
        )
        app[keys.DEVICE_FLOW] = DeviceFlowService(
            client,
            api_keys,
            DeviceFlowConfig(ttl=config.device_code_ttl, interval=config.device_poll_interval),
        )
        app[keys.AUTH_LIMITER] = RateLimiter(client, config.auth_rate_limit_per_minute)
        app[keys.SETTINGS] = SettingsService(UserRecordStore(client, box))
        if config.rate_limit_per_minute:
            app[RATE_LIMITER] = RateLimiter(client, config.rate_limit_per_minute)
        if config.webhook_rate_limit_per_minute:
            app[WEBHOOK_LIMITER] = RateLimiter(client, config.webhook_rate_limit_per_minute)
        yield
        await client.aclose()

    return ctx


def create_app(config: ServiceConfig, *, with_sandboxes: bool = True) -> web.Application:
    """Build the application. Reads nothing from argv or the environment.

    with_sandboxes=False leaves out the Docker-backed services (for settings-only tests and
    hosts without an engine); their routes then answer 503.
    """
    parser_errors.install()
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[
            context_middleware,
            cors_middleware(config.cors_origins),
            pacing_middleware,
            error_middleware,
            size_limit_middleware(config.max_body_bytes),
            auth_middleware,
            webhook_auth_middleware,
            rate_limit_middleware,
            timeout_middleware(config.request_timeout),
            durable_middleware,
        ],
    )
    app.on_response_prepare.append(lift_deadline)
    app[keys.CONFIG] = config
    app[DRAIN] = Drain()
    _pace(app, config)
    metrics = Metrics()
    app[METRICS] = metrics
    metrics.reconcile_fixes.source = lambda: app[RECONCILER].fixes if RECONCILER in app else 0
    # Specs are validated before anything else starts: a bad file stops start-up.
    app[keys.SPECS] = SpecCatalog.load(config.spec_dir, config.image_tag, config.enable_specs)
    app.cleanup_ctx.append(_redis_ctx(config))
    app.cleanup_ctx.append(proxy_ctx)
    track_sockets(app)
    if with_sandboxes:
        app.cleanup_ctx.append(sandbox_ctx(config))
        app.on_startup.append(_start_networks)
    tables = route_tables()
    for table in tables:
        table.register(app)
    app[OPENAPI_DOC] = build_openapi((ep for t in tables for ep in t.endpoints), VERSION)
    return app


def create_webhook_app(main: web.Application) -> web.Application:
    """The webhook listener's application: only the webhook routes, sharing the services of
    `main` (call it once `main` has started, when they all exist)."""
    config = main[keys.CONFIG]
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[
            context_middleware,
            pacing_middleware,
            error_middleware,
            size_limit_middleware(config.max_body_bytes),
            webhook_auth_middleware,
            timeout_middleware(config.request_timeout),
            durable_middleware,
        ],
    )
    for key in main:
        app[key] = main[key]
    _pace(app, config)  # a budget of its own: sandboxes do not spend the API's
    for table in webhook_route_tables():
        table.register(app)
    return app


async def _start_networks(app: web.Application) -> None:
    networks = app[keys.NETWORKS]
    networks.listener.attach(create_webhook_app(app))
    networks.start()


def _pace(app: web.Application, config: ServiceConfig) -> None:
    if config.unauthenticated_rate:
        rate = config.unauthenticated_rate
        app[PACER] = Pacer(rate, burst=max(1, int(2 * rate)))
