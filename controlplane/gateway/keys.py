"""The gateway's application key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from controlplane.gateway.service import GatewayService

GATEWAY: web.AppKey[GatewayService] = web.AppKey("llm_gateway")
