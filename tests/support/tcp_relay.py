"""A TCP relay to a unix socket that a test can cut and restore: every connection through it is
closed at once and new ones are refused until restored. Stands for a network fault between one
replica and Redis (the connection breaks, reconnects fail, then succeed again) while the other
replicas keep their own connections. TcpRelay: the same to a TCP server, which can also cut
itself in the middle of what is sent (a snapshot store lost during an upload), or hold what is
sent past a budget until cut (a store that stops answering in the middle of an upload)."""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.live_server import free_port


class UnixRelay:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.port = free_port()
        self.open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def cut(self) -> None:
        """Close every relayed connection; refuse new ones until `restore`."""
        self.open = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.open = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        up_reader, up_writer = await self._connect()
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer, upstream=False)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
            self._tasks.discard(task)
        for each in (writer, up_writer):
            self._writers.discard(each)
            each.transport.abort()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.socket_path)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(65536):
                if upstream and not self._spend(len(chunk)):
                    return
                if upstream:
                    await self._held(len(chunk))
                    if not self.open:
                        return
                sink.write(chunk)
                await sink.drain()

    def _spend(self, size: int) -> bool:
        """Whether `size` more bytes may go upstream (always, but for TcpRelay's budget)."""
        return True

    async def _held(self, size: int) -> None:
        """Wait while `size` more bytes may not go upstream yet (never, but for TcpRelay's
        stall)."""


class TcpRelay(UnixRelay):
    """A relay to a TCP server (`host:port`) that can also cut itself once a budget of bytes
    sent upstream is spent (`cut_after`): a store that goes away in the middle of an upload."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__("")
        self._upstream = (host, port)
        self._budget: int | None = None
        self._stall: int | None = None
        self._released = asyncio.Event()
        self.stalled = asyncio.Event()  # set once something is held by `stall_after`

    @classmethod
    async def started(cls, url: str) -> TcpRelay:
        """A relay to the server at `url` (`http://host:port`), listening; `close` it."""
        host, port = url.removeprefix("http://").rsplit(":", 1)
        relay = cls(host, int(port))
        await relay.start()
        return relay

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_after(self, size: int) -> None:
        """Cut every connection (and refuse new ones) once `size` more bytes went upstream."""
        self._budget = size

    def stall_after(self, size: int) -> None:
        """Hold what goes upstream once `size` more bytes went, until `cut` (or `restore`)."""
        self._stall = size
        self._released.clear()
        self.stalled.clear()

    def cut(self) -> None:
        super().cut()
        self._released.set()

    def restore(self) -> None:
        self._budget = None
        self._stall = None
        self._released.set()
        super().restore()

    async def _held(self, size: int) -> None:
        if self._stall is None:
            return
        self._stall -= size
        if self._stall < 0:
            self.stalled.set()
            await self._released.wait()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(*self._upstream)

    def _spend(self, size: int) -> bool:
        if self._budget is None:
            return True
        self._budget -= size
        if self._budget < 0:
            self.cut()
            return False
        return True
