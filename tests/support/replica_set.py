"""Several `controlplane serve` replicas of one deployment behind a real balancer (haproxy), as
a platform team runs them: one Redis, one secret key, one container prefix, one webhook port
shared with SO_REUSEPORT (a sandbox's webhooks reach whichever replica is up), and a drain delay
longer than the balancer takes to see /ready turn 503."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from cryptography.fernet import Fernet

from tests.support.balancer import Balancer
from tests.support.live_server import free_port
from tests.support.serve_process import Serve, launch_serve, serve_env

DRAIN_DELAY = 1.5
"""ACS_SHUTDOWN_DRAIN_DELAY: above the balancer's fall (2) x inter (0.25 s) plus a check."""


@dataclass
class ReplicaSet:
    redis_url: str
    prefix: str
    directory: Path
    size: int = 3
    ports: list[int] = field(default_factory=list)
    replicas: list[Serve | None] = field(default_factory=list)
    retired: list[Serve] = field(default_factory=list)
    balancer: Balancer | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = [free_port() for _ in range(self.size)]
        self.replicas = [None] * self.size
        self.env = serve_env(self.redis_url, self.prefix, self.directory / "data")
        self.env.update(
            {
                "ACS_SECRET_KEY": Fernet.generate_key().decode(),
                "ACS_WEBHOOK_PORT": str(free_port()),
                "ACS_SHUTDOWN_DRAIN_DELAY": str(DRAIN_DELAY),
                "ACS_MAX_RUNNING_PER_USER": "0",
                "ACS_WARM_POOL": "0",
                # Boots take long on a host this busy (several starts at once, other work):
                # what is tested is that no start is lost, not how fast one is.
                "ACS_START_TIMEOUT": "90",
            }
        )

    @property
    def url(self) -> str:
        assert self.balancer is not None
        return self.balancer.url

    async def start(self, http: aiohttp.ClientSession) -> None:
        # One first: it makes the deployment's sandbox network; the others find it.
        await self.start_replica(0, http)
        await asyncio.gather(*(self.start_replica(n, http) for n in range(1, self.size)))
        self.balancer = Balancer(self.directory / "haproxy", self.ports)
        self.balancer.start()
        for n in range(self.size):
            await asyncio.to_thread(self.balancer.wait_state, f"r{n}", "UP")

    async def start_replica(self, n: int, http: aiohttp.ClientSession) -> Serve:
        server = await launch_serve(self.ports[n], self.env)
        self.replicas[n] = server
        await server.wait_healthy(http)
        return server

    async def roll(self, n: int, http: aiohttp.ClientSession) -> tuple[float, float]:
        """SIGTERM replica n, wait for it to exit, start it again and wait until the balancer
        sends to it. Returns (seconds until the balancer saw it DOWN, seconds until it
        exited), both from about the signal."""
        server = self.replicas[n]
        assert server is not None
        assert self.balancer is not None
        exiting = asyncio.create_task(server.terminate())
        down = await asyncio.to_thread(self.balancer.wait_state, f"r{n}", "DOWN")
        alive_when_down = not exiting.done()
        code, took = await exiting
        assert code == 0, server.logs()
        assert alive_when_down, "the replica exited before the balancer stopped sending to it"
        self.retired.append(server)
        await self.start_replica(n, http)
        await asyncio.to_thread(self.balancer.wait_state, f"r{n}", "UP")
        return down, took

    async def kill(self, n: int) -> None:
        server = self.replicas[n]
        assert server is not None
        await server.kill()
        self.retired.append(server)
        self.replicas[n] = None

    def logs(self) -> str:
        out = []
        for n, server in enumerate([*self.replicas, *self.retired]):
            if server is not None:
                out.append(f"--- replica {n} (port {server.port})\n{server.logs()}")
        if self.balancer is not None:
            out.append(f"--- haproxy\n{self.balancer.log()}")
        return "\n".join(out)

    async def stop(self) -> None:
        for server in self.replicas:
            if server is not None:
                await server.kill()
        if self.balancer is not None:
            self.balancer.stop()
