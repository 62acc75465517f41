"""A large response body relayed from the sandbox's socket to the client's inside the kernel.

Copied through this process, every byte of a download crosses user space twice (received into a
Python bytes object, then sent); on a busy host that CPU is what separates the proxy from a
direct connection (bench/README.md, `ha.py`). Linux's splice(2) moves the bytes from one
socket through a pipe to the other without copying them into the process, as the Docker
engine's userland proxy does.

Only where it is sure to be right: a body of a known length (Content-Length; not chunked, not a
HEAD) of at least MIN_BYTES, both sides plain TCP sockets (no TLS in this process), on Linux.
Otherwise (or once `splice` reports an error it does not expect) the caller copies as before.

How it takes over the two connections, each step synchronous so that no event-loop callback
sits between them:
- The upstream: the bytes aiohttp has already received are taken from its buffer and its
  transport stops reading; the rest of the body is still in the kernel's socket buffer. The
  connection is closed at the end (aiohttp's parser never saw the body, so it cannot be reused).
- The client: the response's headers and the first bytes go out through aiohttp, and the
  splicing starts once its transport has nothing left to send; the client's connection stays
  usable (exactly Content-Length bytes are sent) for its next request.
- Waiting uses duplicates of the two file descriptors (asyncio lets no one else watch a
  transport's own descriptor), removed from the loop and closed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any, Protocol, cast

import aiohttp
import structlog
from aiohttp import web

log = structlog.get_logger(__name__)

MIN_BYTES = 1024 * 1024
PIPE_BYTES = 1024 * 1024
"""The pipe's capacity, asked for with F_SETPIPE_SZ (the kernel may cap it lower)."""
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_SETPIPE_SZ = 1031  # F_SETPIPE_SZ (Linux; Python 3.11's fcntl does not name it)


class ClientGone(Exception):
    """The client closed its connection during the body."""


class UpstreamBroke(Exception):
    """The sandbox closed its connection, or sent nothing for too long, during the body."""


class StreamTransport(Protocol):
    """What the relay uses of a connection's transport. asyncio's are `asyncio.Transport`s;
    uvloop's (ACS_EVENT_LOOP) are not registered as such but have the same methods."""

    def pause_reading(self) -> None: ...

    def get_write_buffer_size(self) -> int: ...

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def _streaming(transport: object) -> StreamTransport | None:
    needed = ("pause_reading", "get_write_buffer_size", "is_closing", "get_extra_info")
    if transport is None or not all(callable(getattr(transport, n, None)) for n in needed):
        return None
    return cast(StreamTransport, transport)


@dataclass
class Plan:
    """An eligible answer's two sockets, the upstream's transport and the body's length."""

    upstream: socket.socket
    upstream_transport: StreamTransport
    client: socket.socket
    client_transport: StreamTransport
    length: int


@dataclass
class Splice:
    """The state of one relay: where the body's bytes go and how many are left to move."""

    upstream: socket.socket
    client: socket.socket
    remaining: int
    read_timeout: float


def available() -> bool:
    return hasattr(os, "splice")


def plain_socket(transport: StreamTransport | None) -> socket.socket | None:
    """The transport's TCP socket when it is a plain one (no TLS), else None."""
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return None
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    if sock.type != socket.SOCK_STREAM:
        return None
    return sock  # type: ignore[no-any-return]


def plan(request: web.Request, upstream: aiohttp.ClientResponse) -> Plan | None:
    """How this answer's body may be spliced, or None (see the module's docstring)."""
    length = upstream.content_length
    if not available() or length is None or length < MIN_BYTES or request.method == "HEAD":
        return None
    if "chunked" in upstream.headers.get("Transfer-Encoding", "").lower():
        return None
    up_transport = _streaming(
        upstream.connection.transport if upstream.connection is not None else None
    )
    client_transport = _streaming(request.transport)
    if up_transport is None or client_transport is None:
        return None
    up_sock, client_sock = plain_socket(up_transport), plain_socket(client_transport)
    if up_sock is None or client_sock is None:
        return None
    return Plan(up_sock, up_transport, client_sock, client_transport, length)


async def relay(
    how: Plan,
    response: web.StreamResponse,
    upstream: aiohttp.ClientResponse,
    read_timeout: float,
) -> None:
    """Send the whole body of `upstream` to the client after `response`'s headers (prepared),
    as `how` says. Raises ClientGone or UpstreamBroke once the body has begun."""
    try:
        first = await asyncio.wait_for(upstream.content.readany(), read_timeout)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamBroke(type(exc).__name__) from None
    # Synchronous from here to pause_reading: no callback can feed aiohttp more bytes between.
    buffered = first + upstream.content.read_nowait()
    remaining = how.length - len(buffered)
    if remaining > 0:
        # (With the whole body received, aiohttp has already given the connection back to its
        # pool: it must go on reading there.)
        how.upstream_transport.pause_reading()
    try:
        await response.write(buffered)  # the headers go out with it
    except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
        raise ClientGone(type(exc).__name__) from None
    await _flushed(how.client_transport)
    if remaining > 0:
        await _move(Splice(how.upstream, how.client, remaining, read_timeout))
    upstream.close()  # its parser never saw the body: the connection cannot be reused
    log.info("proxy_body_spliced", bytes=how.length, spliced=max(remaining, 0))


async def _flushed(transport: StreamTransport) -> None:
    """Wait until the client's transport holds nothing unsent (what aiohttp wrote must reach
    the socket before the spliced bytes)."""
    while transport.get_write_buffer_size() > 0:
        if transport.is_closing():
            raise ClientGone("closed")
        await asyncio.sleep(0.001)


async def _move(job: Splice) -> None:
    loop = asyncio.get_running_loop()
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    up_fd = os.dup(job.upstream.fileno())
    client_fd = os.dup(job.client.fileno())
    try:
        with contextlib.suppress(OSError):
            import fcntl  # noqa: PLC0415 (Linux only, like splice itself)

            fcntl.fcntl(pipe_w, _SETPIPE_SZ, PIPE_BYTES)
        in_pipe = 0
        while job.remaining > 0 or in_pipe > 0:
            if in_pipe == 0:
                moved = await _splice(loop, up_fd, pipe_w, min(job.remaining, PIPE_BYTES), job)
                if moved == 0:
                    raise UpstreamBroke("closed before the end of the body")
                job.remaining -= moved
                in_pipe += moved
            in_pipe -= await _splice(loop, pipe_r, client_fd, in_pipe, job, to_client=True)
    finally:
        for fd in (pipe_r, pipe_w, up_fd, client_fd):
            os.close(fd)


async def _splice(
    loop: asyncio.AbstractEventLoop,
    src: int,
    dst: int,
    count: int,
    job: Splice,
    *,
    to_client: bool = False,
) -> int:
    """One splice(2) call, waiting (on the socket's duplicate) while it would block."""
    while True:
        try:
            return os.splice(src, dst, count, flags=_FLAGS)
        except BlockingIOError:
            pass
        except OSError as exc:
            if to_client:
                raise ClientGone(exc.strerror or type(exc).__name__) from None
            raise UpstreamBroke(exc.strerror or type(exc).__name__) from None
        if to_client:
            await _ready(loop, dst, writing=True, timeout=None)
        elif not await _ready(loop, src, writing=False, timeout=job.read_timeout):
            raise UpstreamBroke(f"nothing for {job.read_timeout:g} s")


async def _ready(
    loop: asyncio.AbstractEventLoop, fd: int, *, writing: bool, timeout: float | None
) -> bool:
    """Wait until `fd` may be read (or written); False after `timeout` seconds."""
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if writing:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
    except TimeoutError:
        return False
    finally:
        if writing:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)
    return True
