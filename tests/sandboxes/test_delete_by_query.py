"""DELETE /api/v1/sandboxes?sandbox_id=…: the call OpenHandsCloudWorkspace's cleanup makes."""

from __future__ import annotations

from tests.support.sandbox_helpers import OwnDocker, start_running
from tests.support.types import Client, UserHeaders


async def test_delete_by_query_removes_only_your_sandbox(
    sbx: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    sandbox_id = (await start_running(sbx, alice))["id"]

    response = await sbx.delete("/api/v1/sandboxes", params={"sandbox_id": sandbox_id}, headers=bob)
    assert response.status == 404
    assert await response.json() == {"detail": f"sandbox {sandbox_id} not found"}
    assert len(own_docker.containers()) == 1

    response = await sbx.delete(
        "/api/v1/sandboxes", params={"sandbox_id": sandbox_id}, headers=alice
    )
    assert response.status == 200
    assert await response.json() == {"success": True}
    assert (await sbx.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 404
    assert own_docker.containers() == []
    assert own_docker.volumes() == []
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
