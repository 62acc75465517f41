"""A webhook receiver on this host's loopback, for the tests of the lifecycle webhooks: POST
/hook goes to the subclass's `handle`; it can go down (its port closed) and come back."""

from __future__ import annotations

from typing import Self

from aiohttp import web

from tests.support.live_server import free_port


class HookServer:
    def __init__(self, port: int | None = None) -> None:
        """`port`: where it listens, the same across down() and up() (any free one if None)."""
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        raise NotImplementedError

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.down()
