"""Builds the gateway's service for one application and closes it with it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.gateway.credentials import SandboxTokens, UserGatewayKeys
from controlplane.gateway.destinations import Destinations
from controlplane.gateway.forward import Forwarder
from controlplane.gateway.keys import GATEWAY
from controlplane.gateway.metrics import GatewayMetrics
from controlplane.gateway.service import GatewayService
from controlplane.gateway.translator_process import TranslatorProcess
from controlplane.metrics import METRICS


def gateway_ctx(config: ServiceConfig) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async def host_gateway() -> str | None:
            networks = app.get(keys.NETWORKS)
            if networks is None:
                return None
            return (await networks.prepare(app[keys.SPECS].default)).gateway

        # A private directory (0700) for the translator's socket: short enough for AF_UNIX.
        run_dir = Path(tempfile.mkdtemp(prefix="acs-llm-"))
        translator = TranslatorProcess(run_dir)
        forwarder = Forwarder(
            Destinations(lambda: config.sandbox_host_ports, host_gateway),
            translator,
            timeout=config.llm_gateway_timeout,
            retries=config.llm_gateway_retries,
            backoff=config.llm_gateway_backoff,
        )
        sandboxes = app.get(keys.SANDBOXES)
        gateway = GatewayService(
            config,
            app[keys.REDIS],
            app[keys.SECRET_BOX],
            tokens=SandboxTokens(app[keys.SECRET_BOX]),
            user_keys=UserGatewayKeys(app[keys.REDIS], app[keys.SECRET_BOX]),
            sandboxes=sandboxes.store if sandboxes is not None else None,
            forwarder=forwarder,
            metrics=GatewayMetrics(app[METRICS].registry),
        )
        app[GATEWAY] = gateway
        yield
        await gateway.close()
        await forwarder.close()
        await translator.close()
        shutil.rmtree(run_dir, ignore_errors=True)

    return ctx


async def end_streams(app: web.Application) -> None:
    """on_shutdown: open streams end now with an error event instead of being cut (or waited
    for) when the server closes their connections."""
    gateway = app.get(GATEWAY)
    if gateway is not None:
        gateway.forwarder.shutdown()
