"""Helpers of the snapshot tests: a running sandbox, commands in it, snapshots taken."""

from __future__ import annotations

import asyncio
from typing import Any

import docker

from drivers.docker import names as docker_names
from tests.support.sandbox_helpers import start, wait_status
from tests.support.types import Client


async def running(client: Client, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    """A new sandbox (from a spec, or `snapshot_id=`) once RUNNING."""
    if body:
        resp = await client.post("/api/v1/sandboxes", json=body, headers=headers)
        made = await resp.json()
        assert resp.status == 200, made
    else:
        made = await start(client, headers)
    return await wait_status(client, headers, made["id"], "RUNNING", within=90)


def container(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> Any:
    return docker_client.containers.get(docker_names.container_name(prefix, sandbox_id))


async def sh(
    docker_client: docker.DockerClient,
    prefix: str,
    sandbox_id: str,
    script: str,
    *,
    user: str = "agent",
) -> str:
    """Run `script` in the sandbox (as the agent by default); its output. Off the loop."""

    def run() -> str:
        result = container(docker_client, prefix, sandbox_id).exec_run(
            ["sh", "-c", script], user=user
        )
        output = result.output.decode(errors="replace")
        assert result.exit_code == 0, output
        return str(output)

    return await asyncio.to_thread(run)


async def snapshot(
    client: Client, headers: dict[str, str], sandbox_id: str, name: str | None = None
) -> dict[str, Any]:
    body = {"name": name} if name else {}
    url = f"/api/v1/sandboxes/{sandbox_id}/snapshots"
    resp = await client.post(url, json=body, headers=headers)
    taken: dict[str, Any] = await resp.json()
    assert resp.status == 200, taken
    return taken


async def fork_one(
    client: Client, headers: dict[str, str], sandbox_id: str
) -> tuple[str, dict[str, Any]]:
    """A fork of one of the sandbox, once RUNNING: its id, and the fork's answer."""
    url = f"/api/v1/sandboxes/{sandbox_id}/fork"
    resp = await client.post(url, json={"count": 1}, headers=headers)
    forked: dict[str, Any] = await resp.json()
    assert resp.status == 200, forked
    (fork,) = [s["id"] for s in forked["sandboxes"]]
    await wait_status(client, headers, fork, "RUNNING", within=90)
    return fork, forked
