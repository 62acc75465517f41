"""DELETE /api/v1/sandboxes?sandbox_id=…: the call OpenHandsCloudWorkspace's cleanup makes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import docker
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.sandbox_helpers import containers, start, volumes, wait_status

Client = TestClient[web.Request, web.Application]
Headers = Callable[..., Awaitable[dict[str, str]]]


@pytest.fixture
async def sbx(test_prefix: str, make_client: Any) -> Client:
    client: Client = await make_client(with_sandboxes=True, container_prefix=test_prefix)
    return client


async def test_delete_by_query_removes_only_your_sandbox(
    sbx: Client, user_headers: Headers, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    sandbox_id = (await start(sbx, alice))["id"]
    await wait_status(sbx, alice, sandbox_id, "RUNNING")

    response = await sbx.delete("/api/v1/sandboxes", params={"sandbox_id": sandbox_id}, headers=bob)
    assert response.status == 404
    assert await response.json() == {"detail": f"sandbox {sandbox_id} not found"}
    assert len(containers(docker_client, test_prefix)) == 1

    response = await sbx.delete(
        "/api/v1/sandboxes", params={"sandbox_id": sandbox_id}, headers=alice
    )
    assert response.status == 200
    assert await response.json() == {"success": True}
    assert (await sbx.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 404
    assert containers(docker_client, test_prefix) == []
    assert volumes(docker_client, test_prefix) == []
    response = await sbx.delete(
        "/api/v1/sandboxes", params={"sandbox_id": sandbox_id}, headers=alice
    )
    assert response.status == 404


async def test_delete_by_query_needs_the_parameter(sbx: Client, user_headers: Headers) -> None:
    alice = await user_headers("alice")
    response = await sbx.delete("/api/v1/sandboxes", headers=alice)
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["query", "sandbox_id"]
    response = await sbx.delete("/api/v1/sandboxes", params={"id": "x"}, headers=alice)
    assert response.status == 422
    assert (await sbx.delete("/api/v1/sandboxes?sandbox_id=x")).status == 401
