"""Servers that play the attacker's part against the LLM gateway (real sockets, no mocks).

`HostileUpstream`: an OpenAI-compatible provider whose every answer the test writes, down to
the bytes: a status, headers, a body sent in pieces, a connection cut short (what a user's own
`llm_base_url` may answer). It records what reached it (path, headers, body).

`Canary`: a TCP server that counts every connection it accepts and answers any HTTP request
with a chat completion carrying CANARY bytes. It stands where the gateway must never connect
(a port of this host, another user's sandbox): the count says whether it was reached, the
bytes whether its answer came back.

    upstream = await HostileUpstream().start()
    upstream.answer(Answer(status=302, headers={"Location": canary.url}))
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.canary_server import completion

CANARY = "canary-" + secrets.token_hex(8)
"""What a canary answers: found in a response, it came from where the gateway must not go."""


def canary_completion() -> bytes:
    """A well-formed chat completion whose content is CANARY (what a reached canary answers)."""
    return completion(CANARY)


@dataclass
class Answer:
    """One scripted answer: `chunks` are written one by one (each its own write); `cut`
    closes the connection after them without ending the body."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    cut: bool = False
    content_type: str = "application/json"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class HostileUpstream:
    """An OpenAI-compatible provider answering exactly what it is told (`answer`, in order;
    when none is queued, `default`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.received: list[Received] = []
        self.default: Answer = Answer(chunks=[canary_completion()])
        self._queue: deque[Answer] = deque()
        self._runner: web.AppRunner | None = None

    async def start(self) -> HostileUpstream:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def answer(self, *answers: Answer) -> None:
        self._queue.extend(answers)

    def seen(self) -> bytes:
        """Every header and body that reached it, as one blob to search."""
        parts = [json.dumps(r.headers).encode() + r.body for r in self.received]
        return b"\n".join(parts)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.path, dict(request.headers), body))
        answer = self._queue.popleft() if self._queue else self.default
        out = web.StreamResponse(status=answer.status, headers=answer.headers)
        out.content_type = answer.content_type
        if not answer.cut:
            out.content_length = sum(len(c) for c in answer.chunks) or None
        await out.prepare(request)
        for chunk in answer.chunks:
            await out.write(chunk)
            await asyncio.sleep(0)
        if answer.cut:
            assert request.transport is not None
            request.transport.close()
            return out
        await out.write_eof()
        return out


class Canary:
    """Counts the connections it accepts; answers any HTTP request with canary_completion()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Canary:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        body = canary_completion()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip() or 0)
            if length:
                await asyncio.wait_for(reader.readexactly(length), 5)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


def contains_canary(*blobs: Any) -> bool:
    """True when any of `blobs` (bytes, str, or anything JSON) carries CANARY."""
    for blob in blobs:
        raw = blob if isinstance(blob, bytes | str) else json.dumps(blob)
        if CANARY in (raw.decode(errors="replace") if isinstance(raw, bytes) else raw):
            return True
    return False
