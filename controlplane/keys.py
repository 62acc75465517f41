"""Typed application keys: every long-lived service the app factory builds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from controlplane.api.ratelimit import RateLimiter
    from controlplane.auth.device import DeviceFlowService
    from controlplane.auth.service import ApiKeyService
    from controlplane.auth.sessions import SessionService
    from controlplane.config import ServiceConfig
    from controlplane.conversations.service import ConversationService
    from controlplane.crypto import SecretBox
    from controlplane.events.service import EventService
    from controlplane.lifecycle.outbox import Outbox
    from controlplane.lifecycle.publisher import LifecyclePublisher
    from controlplane.sandboxes.networking import SandboxNetworks
    from controlplane.sandboxes.service import SandboxService
    from controlplane.settings.service import SettingsService
    from controlplane.specs.catalog import SpecCatalog

CONFIG: web.AppKey[ServiceConfig] = web.AppKey("config")
REDIS: web.AppKey[aioredis.Redis] = web.AppKey("redis")
SECRET_BOX: web.AppKey[SecretBox] = web.AppKey("secret_box")
API_KEYS: web.AppKey[ApiKeyService] = web.AppKey("api_keys")
SETTINGS: web.AppKey[SettingsService] = web.AppKey("settings")
SPECS: web.AppKey[SpecCatalog] = web.AppKey("specs")
SANDBOXES: web.AppKey[SandboxService] = web.AppKey("sandboxes")
CONVERSATIONS: web.AppKey[ConversationService] = web.AppKey("conversations")
EVENTS: web.AppKey[EventService] = web.AppKey("events")
LIFECYCLE: web.AppKey[LifecyclePublisher] = web.AppKey("lifecycle")
WEBHOOK_OUTBOX: web.AppKey[Outbox] = web.AppKey("webhook_outbox")
"""Only when ACS_LIFECYCLE_WEBHOOK_URLS is set."""
SESSIONS: web.AppKey[SessionService] = web.AppKey("sessions")
DEVICE_FLOW: web.AppKey[DeviceFlowService] = web.AppKey("device_flow")
AUTH_LIMITER: web.AppKey[RateLimiter] = web.AppKey("auth_limiter")
"""Counts sign-in-like attempts per client address (or user): sign-ins, device codes, approvals."""
NETWORKS: web.AppKey[SandboxNetworks] = web.AppKey("networks")
