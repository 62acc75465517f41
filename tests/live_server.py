"""The app served over real HTTP on loopback, as `controlplane serve` serves it: sandboxes reach
its webhooks through the webhook listener on their network's gateway (any free port here)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
import docker
from aiohttp import web

from controlplane import keys
from controlplane.app import create_app
from controlplane.config import ServiceConfig


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def gateway() -> str:
    """The default Docker bridge's gateway (docker0): an address of this machine that is not
    loopback, for tests that need one."""
    client = docker.from_env()
    try:
        configs = client.api.inspect_network("bridge")["IPAM"]["Config"] or []
    finally:
        client.close()
    for config in configs:
        if config.get("Gateway") and ":" not in config["Gateway"]:
            return str(config["Gateway"])
        subnet = config.get("Subnet", "")
        if subnet and ":" not in subnet:  # some engines leave Gateway out: the first address
            return str(next(ipaddress.ip_network(subnet, strict=False).hosts()))
    raise RuntimeError("the Docker bridge network has no IPv4 gateway")


@dataclass
class LiveServer:
    runner: web.AppRunner
    url: str
    app: web.Application

    async def sandbox_gateway(self) -> str:
        """The host's address on the default spec's sandbox network (created if need be): where
        a test server must listen for sandboxes to reach it (with its port in
        ACS_SANDBOX_HOST_PORTS), as host.docker.internal."""
        spec = self.app[keys.SPECS].default
        return (await self.app[keys.NETWORKS].prepare(spec)).gateway

    @property
    def webhook_port(self) -> int:
        return self.app[keys.NETWORKS].listener.port

    async def close(self) -> None:
        if self.runner.server is not None:  # closed once only
            await self.runner.cleanup()


async def start_live_server(config: ServiceConfig, *, with_sandboxes: bool = True) -> LiveServer:
    app = create_app(config, with_sandboxes=with_sandboxes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
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
