"""Graceful shutdown of `controlplane serve`, as a real process: on SIGTERM it stops accepting,
lets the request in flight finish, stops its background loops and exits 0; sandboxes keep
running, and the next start on the same Redis carries on with them."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest
import redis.asyncio as aioredis

from drivers.docker import names as docker_names
from tests.conftest import BOOTSTRAP_KEY
from tests.support.live_server import Api, free_port
from tests.support.serve_process import Serve, launch_serve, serve_env

EXIT_WITHIN = 35  # aiohttp's shutdown_timeout in `serve` is 30 s
START_TIMEOUT = 20  # ACS_START_TIMEOUT: bounds how long the taken-over start may take
PAUSE_MS = 2500  # Redis pauses this long; below the control plane's 5 s Redis timeout
# ACS_SHUTDOWN_TIMEOUT: what the request in flight (held PAUSE_MS) and the launch it began get to
# finish after SIGTERM before the launch is handed over; the exit is bounded by it plus cleanup.
SHUTDOWN_TIMEOUT = 5


@pytest.fixture
async def serve(redis_url: str, test_prefix: str, tmp_path: Path) -> AsyncIterator[Any]:
    """Starts `controlplane serve` processes on one port, Redis, prefix and data dir; kills
    whatever is still running at the end."""
    port = free_port()
    env = serve_env(redis_url, test_prefix, tmp_path / "data")
    env["ACS_SHUTDOWN_TIMEOUT"] = str(SHUTDOWN_TIMEOUT)
    # No warm pool: the start the shutdown interrupts must be a launch, not a pool claim
    # (which answers RUNNING at once).
    env["ACS_WARM_POOL"] = "0"
    started: list[Serve] = []

    async def start() -> Serve:
        server = await launch_serve(port, env)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.kill()


async def wait_settled(api: Api, sandbox_id: str, settled: set[str], within: float) -> Any:
    """Poll until the sandbox's status is in `settled`; fail with the last body."""
    deadline = time.monotonic() + within
    body: Any = None
    while time.monotonic() < deadline:
        status, body = await api.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
        assert status == 200, body
        if body["status"] in settled:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} not {settled} in {within} s: {body}")


async def in_flight_start(port: int, request_id: str) -> tuple[Any, Any]:
    """POST /api/v1/sandboxes, whole, with `Expect: 100-continue`: the server answers
    `100 Continue` once its handler runs, so on return the request is in progress."""
    body = json.dumps({"sandbox_spec_id": "default"}).encode()
    head = (
        "POST /api/v1/sandboxes HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        f"X-Session-API-Key: {BOOTSTRAP_KEY}\r\n"
        f"X-Request-ID: {request_id}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert interim.startswith(b"HTTP/1.1 100"), interim
    return reader, writer


async def read_response(reader: asyncio.StreamReader) -> tuple[int, Any]:
    raw = await asyncio.wait_for(reader.read(), 30)  # Connection: close, so until EOF
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(payload)


async def refused(port: int, within: float = 5) -> None:
    """New connections are refused (the listening sockets are closed)."""
    deadline = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return
        writer.close()
        assert time.monotonic() < deadline, f"port {port} still accepts after {within} s"
        await asyncio.sleep(0.02)


def container_status(client: docker.DockerClient, name: str) -> str:
    return str(client.containers.get(name).status)


async def test_sigterm_drains_and_the_next_start_adopts_the_sandboxes(
    serve: Any, test_prefix: str, docker_client: docker.DockerClient, raw_redis: aioredis.Redis
) -> None:
    async with aiohttp.ClientSession() as http:
        first: Serve = await serve()
        await first.wait_healthy(http)
        api = Api(http, first.url, BOOTSTRAP_KEY)
        running = await api.ok("POST", "/api/v1/sandboxes")
        kept = await wait_settled(api, running["id"], {"RUNNING"}, 60)
        agent_url = kept["exposed_urls"][0]["url"]

        # A request in flight when SIGTERM arrives: it starts a second sandbox, and Redis,
        # paused for PAUSE_MS, holds it in its handler while the server shuts down.
        request_id = f"in-flight-{secrets.token_hex(4)}"
        await raw_redis.client_pause(PAUSE_MS, all=True)
        reader, writer = await in_flight_start(first.port, request_id)
        try:
            signalled = time.monotonic()
            first.process.send_signal(signal.SIGTERM)
            await first.wait_event("shutting_down", 10)
            await refused(first.port)
            status, interrupted = await read_response(reader)
        finally:
            writer.close()
        assert status == 200, interrupted
        assert interrupted["status"] == "STARTING", first.logs()
        # It was still running when shutdown began, and was logged as done after that.
        order = [
            e["event"]
            for e in first.events()
            if e.get("event") == "shutting_down"
            or (e.get("event") == "request" and e.get("request_id") == request_id)
        ]
        assert order == ["shutting_down", "request"], first.logs()

        code, took = await first.exited(signalled)
        assert code == 0, first.logs()
        # The launch in flight finishes or is handed over within the shutdown timeout.
        # Bounded by the timeout, plus what a loaded 2-core host adds to closing (seconds).
        assert took < SHUTDOWN_TIMEOUT + 8, f"exit took {took:.1f} s:\n{first.logs()}"
        levels = {e.get("level") for e in first.events()}
        assert "error" not in levels, first.logs()
        assert "critical" not in levels, first.logs()
        assert not any("Traceback" in line for line in first.lines), first.logs()
        name = docker_names.container_name(test_prefix, running["id"])
        assert await asyncio.to_thread(container_status, docker_client, name) == "running"

        # The next start, on the same Redis: the sandbox is still RUNNING and its agent server
        # answers where it did; the start the shutdown interrupted settles, never stays STARTING.
        second: Serve = await serve()
        await second.wait_healthy(http)
        api = Api(http, second.url, BOOTSTRAP_KEY)
        again = await api.ok("GET", f"/api/v1/sandboxes/{running['id']}")
        assert again["status"] == "RUNNING", again
        assert again["exposed_urls"][0]["url"] == agent_url
        async with http.get(f"{agent_url}/health") as resp:
            assert resp.status == 200
        settled = await wait_settled(
            api, interrupted["id"], {"RUNNING", "ERROR"}, START_TIMEOUT + 30
        )
        if settled["status"] == "RUNNING":
            async with http.get(f"{settled['exposed_urls'][0]['url']}/health") as resp:
                assert resp.status == 200

        code, took = await second.terminate()
        assert code == 0, second.logs()
        # Nothing in flight: far below the 30 s shutdown time-out (5.4 s seen on a loaded host).
        assert took < 10, f"exit took {took:.1f} s:\n{second.logs()}"
        assert await asyncio.to_thread(container_status, docker_client, name) == "running"
