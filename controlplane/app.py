"""The application factory: wires middlewares, routes and every service's lifetime."""

from __future__ import annotations

import functools
import json
from typing import Any

from aiohttp import web

from controlplane import keys, wiring
from controlplane.api import parser_errors
from controlplane.api.cors import cors_middleware
from controlplane.api.durability import durable_middleware
from controlplane.api.openapi import build_openapi
from controlplane.api.pacing import Pacer
from controlplane.api.routing import RouteTable
from controlplane.audit.middleware import audit_middleware
from controlplane.audit.routes import routes as audit_routes
from controlplane.auth.oauth import routes as oauth_routes
from controlplane.auth.web import routes as sign_in_routes
from controlplane.checkpoints.routes import routes as checkpoint_routes
from controlplane.config import ServiceConfig
from controlplane.conversations.legacy import routes as legacy_conversation_routes
from controlplane.conversations.legacy_start import routes as legacy_start_routes
from controlplane.conversations.pending_routes import routes as pending_routes
from controlplane.conversations.routes import routes as conversation_routes
from controlplane.conversations.runtime_routes import routes as conversation_runtime_routes
from controlplane.events.routes import routes as event_routes
from controlplane.events.routes import track_sockets
from controlplane.events.routes import webhook_routes as event_webhook_routes
from controlplane.events.ticket_routes import routes as ticket_routes
from controlplane.gateway.routes import end_streams
from controlplane.gateway.routes import routes as gateway_routes
from controlplane.gateway.routes import sandbox_routes as gateway_sandbox_routes
from controlplane.gateway.translator_process import TranslatorProcess
from controlplane.gauges import Refresher
from controlplane.health import routes as health_routes
from controlplane.lifecycle.routes import routes as lifecycle_routes
from controlplane.metrics import Metrics
from controlplane.middlewares import (
    SeenKeys,
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
from controlplane.organizations.routes import routes as organization_routes
from controlplane.proxy.routes import routes as proxy_routes
from controlplane.sandboxes.agent_webhooks import webhook_routes as agent_webhook_routes
from controlplane.sandboxes.cloud_proxy import routes as cloud_proxy_routes
from controlplane.sandboxes.pool_routes import routes as pool_routes
from controlplane.sandboxes.routes import routes as sandbox_routes
from controlplane.sandboxes.secret_routes import routes as sandbox_secret_routes
from controlplane.settings.profile_routes import routes as profile_routes
from controlplane.settings.routes import routes as settings_routes
from controlplane.settings.schema_routes import routes as settings_schema_routes
from controlplane.settings.user_routes import routes as user_routes
from controlplane.shutdown import Drain
from controlplane.snapshots.routes import routes as snapshot_routes
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.routes import routes as spec_routes
from controlplane.webapp.routes import routes as web_app_routes
from controlplane.webapp.static import register_web_app
from controlplane.webclient.canvas_routes import routes as canvas_routes
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
        snapshot_routes,
        conversation_routes,
        checkpoint_routes,
        legacy_conversation_routes,
        pending_routes,
        event_routes,
        ticket_routes,
        *webhook_route_tables(),
        lifecycle_routes,
        audit_routes,
        web_client_routes,
        gateway_routes,
        # OpenHands' current clients (Agent Canvas, SDK 1.58): docs/api.md#openhands-clients.
        settings_schema_routes,
        profile_routes,
        organization_routes,
        canvas_routes,
        web_app_routes,
        conversation_runtime_routes,
        cloud_proxy_routes,
        legacy_start_routes,
        proxy_routes,
    ]


def webhook_route_tables() -> list[RouteTable]:
    """The routes sandboxes call: served by the API and, alone, by the webhook listener on the
    sandbox networks' gateways (create_webhook_app)."""
    return [
        event_webhook_routes,
        agent_webhook_routes,
        gateway_sandbox_routes,
        sandbox_secret_routes,
    ]


def create_app(
    config: ServiceConfig,
    *,
    with_sandboxes: bool = True,
    translator: TranslatorProcess | None = None,
) -> web.Application:
    """Build the application. Reads nothing from argv or the environment.

    with_sandboxes=False leaves out the services that need the sandbox runtime (for settings-only
    tests and hosts without one); their routes then answer 503. `translator`: an LLM translator
    shared with other apps of this process, which its owner stops (by default the app starts
    its own when a call first needs it).
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
            audit_middleware,
            auth_middleware,
            webhook_auth_middleware,
            rate_limit_middleware,
            timeout_middleware(config.request_timeout),
            durable_middleware,
        ],
    )
    app.on_response_prepare.append(lift_deadline)
    app[keys.CONFIG] = config
    app[keys.DRAIN] = Drain()
    app[keys.WEBHOOK_KEYS] = SeenKeys()
    _pace(app, config)
    app[keys.METRICS] = Metrics()
    app[keys.GAUGES] = Refresher()
    # Specs are validated before anything else starts: a bad file stops start-up.
    app[keys.SPECS] = SpecCatalog.load(config.spec_dir, config.image_tag, config.enable_specs)
    for ctx in wiring.contexts(
        config, with_sandboxes=with_sandboxes, webhook_app=create_webhook_app, translator=translator
    ):
        app.cleanup_ctx.append(ctx)
    track_sockets(app, config.max_event_sockets_per_user)
    app.on_shutdown.append(end_streams)
    for table in route_tables():
        table.register(app)
    app[keys.OPENAPI_DOC] = openapi_json()
    if config.web_app_dir is not None:
        register_web_app(app, config.web_app_dir)  # last: it takes every GET nothing else does
    return app


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of route_tables(), built once per process: it is the same for every
    app, and building it (pydantic's schemas of every model) takes a few hundred milliseconds."""
    return build_openapi((ep for t in route_tables() for ep in t.endpoints), VERSION)


@functools.cache
def openapi_json() -> bytes:
    """The document as /api/openapi.json serves it, serialised once per process: immutable, so
    every app shares it (a deep copy per app was most of the cost of making one)."""
    return json.dumps(openapi_document()).encode()


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
    app.on_shutdown.append(end_streams)
    for table in webhook_route_tables():
        table.register(app)
    return app


def _pace(app: web.Application, config: ServiceConfig) -> None:
    if config.unauthenticated_rate:
        rate = config.unauthenticated_rate
        app[keys.PACER] = Pacer(rate, burst=max(1, int(2 * rate)))
