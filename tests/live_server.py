"""The app served over real HTTP, on loopback and on the Docker bridge gateway (same port), so
that sandboxes reach its webhooks at host.docker.internal as they do under `controlplane serve`."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from drivers.docker import bridge_gateway


def free_port(address: str) -> int:
    # Chosen on the bridge address, where nothing else of ours listens; loopback is then
    # bound to the same number (a clash there fails loudly at bind).
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def gateway() -> str:
    address = bridge_gateway()
    if address is None:
        raise RuntimeError("no Docker bridge gateway: is the engine running?")
    return address


@dataclass
class LiveServer:
    runner: web.AppRunner
    url: str
    app: web.Application

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_live_server(config: ServiceConfig) -> LiveServer:
    bridge = gateway()
    port = free_port(bridge)
    config = config.model_copy(update={"public_url": f"http://host.docker.internal:{port}"})
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    for address in ("127.0.0.1", bridge):
        await web.TCPSite(runner, address, port).start()
    return LiveServer(runner=runner, url=f"http://127.0.0.1:{port}", app=app)


class Api:
    """A thin JSON client for one user of a live server."""

    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http = http
        self.base = base
        self.headers = {"X-Session-API-Key": key}
        self.key = key

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(
            method, self.base + path, headers=self.headers, **kwargs
        ) as resp:
            body = await resp.json(content_type=None) if resp.content_length != 0 else None
            return resp.status, body

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        status, body = await self.call(method, path, **kwargs)
        assert 200 <= status < 300, (method, path, status, body)
        return body
