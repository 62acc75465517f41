"""DELETE /api/v1/sandboxes?sandbox_id=…: the call OpenHandsCloudWorkspace's cleanup makes."""

from __future__ import annotations

import docker

from tests.support.sandbox_helpers import containers, start, volumes, wait_status
from tests.support.types import Client, UserHeaders


async def test_delete_by_query_removes_only_your_sandbox(
    sbx: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
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


async def test_delete_by_query_needs_the_parameter(sbx: Client, user_headers: UserHeaders) -> None:
    alice = await user_headers("alice")
    response = await sbx.delete("/api/v1/sandboxes", headers=alice)
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["query", "sandbox_id"]
    response = await sbx.delete("/api/v1/sandboxes", params={"id": "x"}, headers=alice)
    assert response.status == 422
    assert (await sbx.delete("/api/v1/sandboxes?sandbox_id=x")).status == 401
