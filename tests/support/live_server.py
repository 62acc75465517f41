"""The app served over real HTTP on loopback, as `controlplane serve` serves it: sandboxes reach
its webhooks through the webhook listener on their network's gateway (any free port here)."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from controlplane import keys
from controlplane.app import create_app
from controlplane.config import ServiceConfig
from controlplane.gateway.translator_process import TranslatorProcess
from controlplane.sandboxes.launcher import network_policy
from controlplane.specs.models import SandboxSpec
from drivers.docker.driver import DockerDriver
from drivers.docker.egress import Attachment, SandboxNetworks

# Ports for servers a test starts come from below the kernel's ephemeral range (32768-60999),
# one block per xdist worker. A port the kernel hands out (bind to 0) can be taken again, before
# the server binds it, by any outgoing connection or by Docker publishing a port: CI saw
# "address already in use" that way. Below the ephemeral range only these blocks compete.
_PORT_BLOCK = 1500
_PORTS_FROM = 20000
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 8
_next_port = itertools.count(random.randrange(_PORT_BLOCK))


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now, in this worker's own block (never another worker's)."""
    base = _PORTS_FROM + _WORKER * _PORT_BLOCK
    for _ in range(_PORT_BLOCK):
        port = base + next(_next_port) % _PORT_BLOCK
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {base}-{base + _PORT_BLOCK - 1} on {address}")


def docker_networks(app: web.Application) -> SandboxNetworks:
    """The Docker driver's sandbox networks, for tests that look at them."""
    driver = app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    assert driver.networks is not None
    return driver.networks


async def attachment(app: web.Application, spec: SandboxSpec) -> Attachment:
    """The spec's sandbox network on Docker (made if need be): its name and gateway."""
    return await docker_networks(app).prepare(network_policy(spec))


@dataclass
class LiveServer:
    runner: web.AppRunner
    url: str
    app: web.Application

    async def sandbox_gateway(self) -> str:
        """The host's address on the default spec's sandbox network (created if need be): where
        a test server must listen for sandboxes to reach it (with its port in
        ACS_SANDBOX_HOST_PORTS), as host.docker.internal."""
        return (await attachment(self.app, self.app[keys.SPECS].default)).gateway

    @property
    def webhook_port(self) -> int:
        return self.app[keys.WEBHOOK_LISTENER].port

    async def close(self) -> None:
        if self.runner.server is not None:  # closed once only
            await self.runner.cleanup()


LiveServerFactory = Callable[..., Awaitable[LiveServer]]
"""make_plain_live (tests/security/conftest.py): a live server made with settings of its own."""


async def start_live_server(
    config: ServiceConfig,
    *,
    with_sandboxes: bool = True,
    host: str = "127.0.0.1",
    port: int = 0,
    translator: TranslatorProcess | None = None,
) -> LiveServer:
    """The app of `config` served on `host`:`port` (any free port by default); `translator`:
    the worker's (tests/support/shared_translator.py) instead of one of its own."""
    app = create_app(config, with_sandboxes=with_sandboxes, translator=translator)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    port = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
    return LiveServer(runner=runner, url=f"http://{host}:{port}", app=app)


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


async def running_sandbox(api: Api, spec: str | None = None, within: float = 90) -> dict[str, Any]:
    """A new sandbox of `api`'s user (`spec`, else the default) once RUNNING: its body then. It
    may be STARTING meanwhile, nothing else."""
    body: dict[str, Any] = {"sandbox_spec_id": spec} if spec else {}
    created = await api.ok("POST", "/api/v1/sandboxes", json=body)
    deadline = time.monotonic() + within
    while True:
        body = await api.ok("GET", f"/api/v1/sandboxes/{created['id']}")
        if body["status"] == "RUNNING":
            return body
        assert body["status"] == "STARTING", body
        assert time.monotonic() < deadline, f"sandbox {created['id']} not RUNNING in {within} s"
        await asyncio.sleep(0.1)
