"""Quotas per organization and per member: an organization's caps apply to each of its members
(over the deployment's ACS_MAX_*_PER_USER), a member's own caps over the organization's; checked
in the same Redis script as the create, as the deployment's are."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}


async def test_organization_and_member_caps(
    make_sandbox_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_sandbox_client(max_running_per_user=5)

    async def call(method: str, path: str, who: dict[str, str], **kw: Any) -> tuple[int, Any]:
        async with client.request(method, path, headers=who, **kw) as response:
            return response.status, await response.json()

    made = {"id": "eng", "name": "Eng", "owner": "olivia"}
    assert (await call("POST", "/api/organizations", ADMIN, json=made))[0] == 201
    status, org = await call(
        "PATCH", "/api/organizations/eng", ADMIN, json={"limits": {"max_running_sandboxes": 1}}
    )
    assert status == 200, org
    assert org["limits"]["max_running_sandboxes"] == 1
    for user in ("bob", "mia"):
        await call("PUT", f"/api/organizations/eng/members/{user}", ADMIN, json={"role": "member"})
    keys = ApiKeyService(raw_redis, None)
    bob = {"X-Session-API-Key": (await keys.create("bob", org_id="eng")).key}
    mia = {"X-Session-API-Key": (await keys.create("mia", org_id="eng")).key}

    assert (await call("POST", "/api/v1/sandboxes", bob, json={}))[0] == 200
    status, refused = await call("POST", "/api/v1/sandboxes", bob, json={})
    assert status == 429
    assert "already has 1 sandboxes starting or running" in refused["detail"]

    # mia's own cap (2) is above the organization's.
    status, member = await call(
        "PUT",
        "/api/organizations/eng/members/mia",
        ADMIN,
        json={"role": "member", "limits": {"max_running_sandboxes": 2}},
    )
    assert status == 200, member
    assert member["limits"]["max_running_sandboxes"] == 2
    assert (await call("POST", "/api/v1/sandboxes", mia, json={}))[0] == 200
    assert (await call("POST", "/api/v1/sandboxes", mia, json={}))[0] == 200
    assert (await call("POST", "/api/v1/sandboxes", mia, json={}))[0] == 429
    # A member changes no limits, not even their own.
    status, _ = await call(
        "PUT",
        "/api/organizations/eng/members/mia",
        mia,
        json={"role": "member", "limits": {"max_running_sandboxes": 9}},
    )
    assert status == 403
