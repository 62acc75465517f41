"""The webhook listener: a second HTTP server on the sandbox networks' gateway addresses that
serves only the sandbox webhook routes (controlplane/app.py: create_webhook_app). The API stays on
the addresses the operator chose; this is the one host service a sandbox reaches by default."""

from __future__ import annotations

import asyncio

from aiohttp import web


class WebhookListener:
    """One runner, one site per gateway address, one port for all of them.

    `port` 0 takes a free port at the first bind (tests); a fixed port keeps the URLs that
    running sandboxes were given valid across restarts of the control plane. Sites use
    SO_REUSEPORT so that replicas on one host can share the port.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._addresses: set[str] = set()
        self._lock = asyncio.Lock()

    def attach(self, app: web.Application) -> None:
        self._app = app

    @property
    def addresses(self) -> set[str]:
        return set(self._addresses)

    async def bind(self, address: str) -> int:
        """Listen on `address` (idempotent). Returns the port. Raises OSError."""
        async with self._lock:
            if address in self._addresses:
                return self.port
            if self._runner is None:
                if self._app is None:
                    raise OSError("the webhook listener is not attached to an application yet")
                runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=5)
                await runner.setup()
                self._runner = runner
            site = web.TCPSite(self._runner, address, self.port, reuse_port=True)
            await site.start()
            if self.port == 0:
                self.port = next(int(a[1]) for a in self._runner.addresses if isinstance(a, tuple))
            self._addresses.add(address)
            return self.port

    async def close(self) -> None:
        async with self._lock:
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None
            self._addresses.clear()
