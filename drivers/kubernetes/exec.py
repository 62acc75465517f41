"""A command run in a pod's container through the API server's exec subresource (`pods/exec`,
the v4.channel.k8s.io websocket protocol, which every supported Kubernetes serves): its stdin
written, its stdout read as the frames of drivers/files_helper.py (one type byte, a 4-byte
big-endian length, the payload) or as lines, its exit status read at the end.

The snapshot capability (drivers/kubernetes/files.py) talks to its helper pods this way and holds
a running sandbox still through it. Nothing that comes back is trusted beyond its framing: sizes
are bounded by the caller, and what a sandbox prints is only ever compared with a fixed word.
v4 has no way to close stdin alone: the programs run this way know from their input when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from typing import Any

import aiohttp

from drivers.errors import DriverError, RuntimeUnavailable
from drivers.kubernetes.api import KubeApi, pods

STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
PIECE = 1 << 20
STDERR_KEPT = 8192
MESSAGE_MAX = 8 << 20
"""The largest websocket message taken from the API server (it sends far smaller ones)."""
FRAME_MAX = 32 << 20
"""The largest frame a helper may send: a listing of about 150,000 files. Bounded because
the names are the agent's and a listing grows about tenfold once parsed."""


class ExecFailed(DriverError):
    """The command ended without what was expected (its last words are the message)."""


class Exec:
    """One running command. Open with `Exec.open`, close with `close` (which ends it: the API
    server closes its stdin and the container runtime ends the stream)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, what: str) -> None:
        self._ws = ws
        self._what = what
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._status: dict[str, Any] | None = None
        self._eof = False

    @classmethod
    async def open(
        cls, api: KubeApi, namespace: str, pod: str, container: str, argv: list[str], *, what: str
    ) -> Exec:
        client = await api.ws()
        query: list[tuple[str, str]] = [("command", arg) for arg in argv]
        query += [("container", container), ("stdin", "true"), ("stdout", "true")]
        query += [("stderr", "true"), ("tty", "false")]
        try:
            connecting = await client.call_api(
                pods(namespace, pod) + "/exec",
                "GET",
                query_params=query,
                header_params={"sec-websocket-protocol": "v4.channel.k8s.io"},
                auth_settings=["BearerToken"],
                _preload_content=False,
            )
            ws = await connecting
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise DriverError(
                    f"Kubernetes refused the control plane's exec into pod {pod} ({exc.status}): "
                    "snapshots need `create` on pods/exec in the sandbox namespace (see "
                    "docs/deployment.md, RBAC)"
                ) from None
            raise RuntimeUnavailable(f"exec into pod {pod} failed: {exc.status} {exc}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RuntimeUnavailable(f"exec into pod {pod} failed: {exc!r}") from None
        return cls(ws, what)

    # -- writing --------------------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        try:
            for at in range(0, len(data), PIECE):
                await self._ws.send_bytes(bytes([STDIN]) + data[at : at + PIECE])
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise RuntimeUnavailable(f"{self._what}: the exec stream broke: {exc!r}") from None

    async def send(self, kind: bytes, payload: bytes) -> None:
        await self.write(kind + struct.pack(">I", len(payload)) + payload)

    async def send_json(self, message: dict[str, Any]) -> None:
        await self.send(b"J", json.dumps(message, separators=(",", ":")).encode())

    # -- reading --------------------------------------------------------------------------------

    async def _pump(self) -> None:
        """One message of the stream into stdout, stderr or the status."""
        message = await self._ws.receive()
        if message.type == aiohttp.WSMsgType.BINARY:
            data: bytes = message.data
        elif message.type == aiohttp.WSMsgType.TEXT:
            data = message.data.encode()
        else:  # closed, closing or an error: the command has ended
            self._eof = True
            return
        if not data:
            return
        if len(data) > MESSAGE_MAX:  # dropped, the stream would be read out of step
            raise ExecFailed(f"the API server sent a message of {len(data)} bytes")
        channel, body = data[0], data[1:]
        if channel == STDOUT:
            self._stdout.extend(body)
        elif channel == STDERR:
            self._stderr.extend(body)
            del self._stderr[:-STDERR_KEPT]
        elif channel == ERROR and body:
            with contextlib.suppress(ValueError):
                self._status = json.loads(body)

    async def read(self) -> tuple[bytes, bytes]:
        """The next frame on stdout. Raises ExecFailed when the command ended without one."""
        while True:
            if len(self._stdout) >= 5:
                size = struct.unpack(">I", self._stdout[1:5])[0]
                if size > FRAME_MAX:
                    raise ExecFailed(f"{self._what}: a frame of {size} bytes")
                if len(self._stdout) >= 5 + size:
                    kind = bytes(self._stdout[:1])
                    payload = bytes(self._stdout[5 : 5 + size])
                    del self._stdout[: 5 + size]
                    return kind, payload
            if self._eof:
                raise ExecFailed(f"{self._what} failed: {self.last_words()}")
            await self._pump()

    async def read_json(self) -> dict[str, Any]:
        kind, payload = await self.read()
        if kind != b"J":
            raise ExecFailed(f"{self._what} said {kind!r} out of turn")
        message: dict[str, Any] = json.loads(payload)
        return message

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.send_json(message)
        return await self.read_json()

    async def line(self, limit: int = 256) -> str:
        """The next line on stdout (at most `limit` bytes). Raises ExecFailed at the end."""
        while True:
            end = self._stdout.find(b"\n")
            if end >= 0:
                text = bytes(self._stdout[:end])
                del self._stdout[: end + 1]
                return text.decode(errors="replace")
            if len(self._stdout) > limit:
                raise ExecFailed(f"{self._what}: a line longer than {limit} bytes")
            if self._eof:
                raise ExecFailed(f"{self._what} failed: {self.last_words()}")
            await self._pump()

    def last_words(self) -> str:
        lines = self._stderr.decode(errors="replace").strip().splitlines()
        if lines:
            return lines[-1]
        if self._status is not None:
            return str(self._status.get("message") or self._status.get("status"))
        return "it ended without a word"

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(), 5)
