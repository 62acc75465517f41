"""A web application a sandbox might serve on a second port, for the proxy's tests and bench:
the default image with WORKER_1 exposed (PROXIED_SPEC) and a small aiohttp server (APP) run
inside the sandbox as the agent's user (`serve_app`)."""

from __future__ import annotations

import asyncio

import docker

from drivers.docker import names as docker_names
from tests.support.sandbox_helpers import DEFAULT_IMAGE

PROXIED_SPEC = f"""
id: proxied
description: the default image with a second exposed port, for the proxy tests
image: {DEFAULT_IMAGE}
command: ["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]
working_dir: /workspace
exposed_ports: {{AGENT_SERVER: 8000, WORKER_1: 9000}}
resources: {{cpus: 1.0, memory: 512m, pids: 256}}
"""

# A web application a sandbox might serve on WORKER_1 (run by the agent's user, as the agent's
# commands are): it tells what reached it, streams, sleeps, sets cookies, echoes a WebSocket.
APP = r"""
import asyncio
from aiohttp import web, WSMsgType

async def ping(request):
    return web.Response(text="ok")

async def headers(request):
    return web.json_response({"headers": dict(request.headers), "path": request.raw_path})

async def upload(request):
    n = 0
    async for chunk in request.content.iter_any():
        n += len(chunk)
    return web.json_response({"bytes": n})

async def big(request):
    size = int(request.query["mb"]) << 20
    response = web.StreamResponse()
    response.content_length = size
    await response.prepare(request)
    block = bytes(range(256)) * 4096
    for _ in range(size // len(block)):
        await response.write(block)
    return response

async def slow(request):
    await asyncio.sleep(float(request.query["s"]))
    return web.json_response({"slept": True})

async def cookies(request):
    response = web.json_response({"ok": True})
    response.headers.add("Set-Cookie", "app=1; Path=/; Domain=example.com; HttpOnly")
    response.headers.add("Set-Cookie", "acs_session=stolen; Path=/")
    response.headers["Access-Control-Allow-Origin"] = "*"
    return response

async def echo(request):
    ws = web.WebSocketResponse(max_msg_size=0)
    await ws.prepare(request)
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await ws.send_str(msg.data.upper())
        elif msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data[::-1])
    return ws

app = web.Application(client_max_size=64 << 20)
app.router.add_get("/ping", ping)
app.router.add_get("/headers", headers)
app.router.add_post("/upload", upload)
app.router.add_get("/big", big)
app.router.add_get("/slow", slow)
app.router.add_get("/cookies", cookies)
app.router.add_get("/ws", echo)
web.run_app(app, host="0.0.0.0", port=9000, print=None)
"""


async def serve_app(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> None:
    """Start APP in the sandbox, as the agent's user (uid 1000), in the background."""
    container = docker_client.containers.get(docker_names.container_name(prefix, sandbox_id))
    await asyncio.to_thread(
        container.exec_run, ["/opt/agent/bin/python", "-c", APP], user="1000", detach=True
    )
