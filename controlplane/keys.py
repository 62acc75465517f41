"""Typed application keys: every object the app keeps for its lifetime, in one place.

The wiring (controlplane/wiring.py) and create_app set them; handlers and middlewares read them.
The types are imported for the type checker only: this module depends on nothing at run time, so
any layer may read a key (the layer contract, pyproject.toml, ignores these type-only imports).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from controlplane.api.pacing import Pacer
    from controlplane.api.ratelimit import RateLimiter
    from controlplane.audit.search import AuditSearch
    from controlplane.auth.device import DeviceFlowService
    from controlplane.auth.oidc_flow import SignInFlow
    from controlplane.auth.service import ApiKeyService
    from controlplane.auth.sessions import SessionService
    from controlplane.auth.tickets import TicketService
    from controlplane.checkpoints.service import CheckpointService
    from controlplane.checkpoints.taking import Checkpointer
    from controlplane.config import ServiceConfig
    from controlplane.conversations.service import ConversationService
    from controlplane.crypto import SecretBox
    from controlplane.events.service import EventService
    from controlplane.events.socket_cap import SocketCap
    from controlplane.gateway.service import GatewayService
    from controlplane.gauges import Refresher
    from controlplane.lifecycle.outbox import Outbox
    from controlplane.lifecycle.publisher import LifecyclePublisher
    from controlplane.metrics import Metrics
    from controlplane.middlewares import SeenKeys
    from controlplane.organizations.service import OrganizationService
    from controlplane.outbound.sources import OutboundSources
    from controlplane.proxy.state import ProxyState
    from controlplane.sandboxes.models import SandboxRecord
    from controlplane.sandboxes.pool import WarmPool
    from controlplane.sandboxes.reaper import IdleReaper
    from controlplane.sandboxes.reconciler import Reconciler
    from controlplane.sandboxes.runtime_http import RuntimeHttp
    from controlplane.sandboxes.service import SandboxService
    from controlplane.sandboxes.webhook_listener import WebhookListener
    from controlplane.settings.profiles import LlmProfiles
    from controlplane.settings.service import SettingsService
    from controlplane.shutdown import Drain
    from controlplane.snapshots.collector import Collector
    from controlplane.snapshots.service import SnapshotService
    from controlplane.snapshots.sources import SnapshotData
    from controlplane.specs.catalog import SpecCatalog
    from controlplane.store.audit import AuditLog
    from drivers.base import SandboxDriver

# -- always (create_app and the Redis context) -------------------------------------------------
CONFIG: web.AppKey[ServiceConfig] = web.AppKey("config")
DRAIN: web.AppKey[Drain] = web.AppKey("drain")
"""This replica's shutdown (controlplane/shutdown.py): `/ready` answers 503 once it began."""
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
"""This app's Prometheus registry and metrics (controlplane/metrics.py)."""
GAUGES: web.AppKey[Refresher] = web.AppKey("gauges")
"""/metrics' gauges, refreshed one at a time on this replica (controlplane/gauges.py)."""
SPECS: web.AppKey[SpecCatalog] = web.AppKey("specs")
OPENAPI_DOC: web.AppKey[bytes] = web.AppKey("openapi_doc")
"""The OpenAPI document as served (JSON), the same bytes for every app of a process
(controlplane/app.py): bytes, so that no app can change what another serves."""
OpenSockets = weakref.WeakSet[web.WebSocketResponse]
OPEN_SOCKETS: web.AppKey[OpenSockets] = web.AppKey("open_sockets")
"""Live event sockets, closed at shutdown so that they do not hold it up."""
SOCKET_CAP: web.AppKey[SocketCap] = web.AppKey("socket_cap")
"""Live event sockets per user on this replica (events/socket_cap.py)."""
PACER: web.AppKey[Pacer] = web.AppKey("pacer")
"""Only when ACS_UNAUTHENTICATED_RATE is set: paces requests without a principal."""
REDIS: web.AppKey[aioredis.Redis] = web.AppKey("redis")
SECRET_BOX: web.AppKey[SecretBox] = web.AppKey("secret_box")
API_KEYS: web.AppKey[ApiKeyService] = web.AppKey("api_keys")
SESSIONS: web.AppKey[SessionService] = web.AppKey("sessions")
TICKETS: web.AppKey[TicketService] = web.AppKey("ws_tickets")
DEVICE_FLOW: web.AppKey[DeviceFlowService] = web.AppKey("device_flow")
OIDC_SIGN_IN: web.AppKey[SignInFlow] = web.AppKey("oidc_sign_in")
"""Only when ACS_OIDC_ISSUER is set: browsers sign in through the OpenID provider."""
ORGANIZATIONS: web.AppKey[OrganizationService] = web.AppKey("organizations")
"""Organizations and roles: where each request acts (the auth middleware), members, limits."""
AUTH_LIMITER: web.AppKey[RateLimiter] = web.AppKey("auth_limiter")
"""Counts sign-in-like attempts per client address (or user): sign-ins, device codes, approvals."""
RATE_LIMITER: web.AppKey[RateLimiter] = web.AppKey("rate_limiter")
"""Only when ACS_RATE_LIMIT_PER_MINUTE is not 0: requests per API key."""
WEBHOOK_LIMITER: web.AppKey[RateLimiter] = web.AppKey("webhook_limiter")
"""Only when ACS_WEBHOOK_RATE_LIMIT_PER_MINUTE is not 0: webhook requests per sandbox."""
SETTINGS: web.AppKey[SettingsService] = web.AppKey("settings")
PROFILES: web.AppKey[LlmProfiles] = web.AppKey("llm_profiles")
"""The users' named LLM settings (Agent Canvas's profiles), in their settings records."""
GATEWAY: web.AppKey[GatewayService] = web.AppKey("llm_gateway")
"""The LLM gateway (controlplane/gateway): with sandboxes it also checks their credentials;
without, it serves the users' own gateway keys only."""

# -- with sandboxes (create_app(with_sandboxes=True)) ------------------------------------------
DRIVER: web.AppKey[SandboxDriver] = web.AppKey("driver")
WEBHOOK_LISTENER: web.AppKey[WebhookListener] = web.AppKey("webhook_listener")
"""The server sandboxes post their webhooks to (the driver binds it where they reach it)."""
HTTP_CLIENT: web.AppKey[aiohttp.ClientSession] = web.AppKey("http_client", aiohttp.ClientSession)
"""The control plane's client to agent servers (one connection pool; webhook receivers and
model providers have clients of the outbound policy's: controlplane/outbound)."""
RUNTIME_HTTP: web.AppKey[RuntimeHttp] = web.AppKey("runtime_http")
"""Requests browser clients have the control plane send to a sandbox's agent server
(POST /api/cloud-proxy, a conversation's git and file reads): bounded answers, own pool."""
LIFECYCLE: web.AppKey[LifecyclePublisher] = web.AppKey("lifecycle")
AUDIT_LOG: web.AppKey[AuditLog] = web.AppKey("audit_log")
"""The audit log's writer (store/audit.py), handed to every request's audit scope."""
AUDIT_SEARCH: web.AppKey[AuditSearch] = web.AppKey("audit_search")
OUTBOUND: web.AppKey[OutboundSources] = web.AppKey("outbound")
"""The outbound policies (for users, for the operator's URLs) and what keeps them current
(controlplane/outbound)."""
WEBHOOK_OUTBOX: web.AppKey[Outbox] = web.AppKey("webhook_outbox")
"""Only when ACS_LIFECYCLE_WEBHOOK_URLS is set."""
SANDBOXES: web.AppKey[SandboxService] = web.AppKey("sandboxes")
RECONCILER: web.AppKey[Reconciler] = web.AppKey("reconciler")
REAPER: web.AppKey[IdleReaper] = web.AppKey("reaper")
POOL: web.AppKey[WarmPool] = web.AppKey("warm_pool")
SNAPSHOT_DATA: web.AppKey[SnapshotData] = web.AppKey("snapshot_data")
"""Only with ACS_SNAPSHOT_STORE_URL: the store, its client and the users' keys."""
SNAPSHOTS: web.AppKey[SnapshotService] = web.AppKey("snapshots")
"""Only with ACS_SNAPSHOT_STORE_URL."""
COLLECTOR: web.AppKey[Collector] = web.AppKey("snapshot_collector")
CONVERSATIONS: web.AppKey[ConversationService] = web.AppKey("conversations")
EVENTS: web.AppKey[EventService] = web.AppKey("events")
CHECKPOINTER: web.AppKey[Checkpointer] = web.AppKey("checkpointer")
"""Only with ACS_SNAPSHOT_STORE_URL: checkpoints taken at users' messages."""
CHECKPOINTS: web.AppKey[CheckpointService] = web.AppKey("checkpoints")
"""Only with ACS_SNAPSHOT_STORE_URL: a conversation's checkpoints, rewind and fork."""

# -- request keys ------------------------------------------------------------------------------
SANDBOX_SCOPE: web.RequestKey[SandboxRecord] = web.RequestKey("sandbox_scope")
"""The caller's sandbox whose X-Session-API-Key came with their own key
(controlplane/auth/sandbox_scope.py): what SDK code in that sandbox may be handed."""
WEBHOOK_KEYS: web.AppKey[SeenKeys] = web.AppKey("webhook_keys")
"""The sandboxes' session keys (hashed) last seen good by the events webhook
(middlewares.SeenKeys): where a post may skip the key's look-up before its body."""
WEBHOOK_SANDBOX: web.RequestKey[str] = web.RequestKey("webhook_sandbox")
"""The sandbox whose session key the webhook middleware checked for this request: the
handler's service does not look the key up a second time."""
PROXY: web.AppKey[ProxyState] = web.AppKey("sandbox_proxy")
"""The sandbox proxy's client, open sockets and access grants (controlplane/proxy/)."""
