"""Quotas per organization and per member: an organization's caps apply to each of its members
(over the deployment's ACS_MAX_*_PER_USER), a member's own caps over the organization's; checked
in the same Redis script as the create, as the deployment's are."""

from __future__ import annotations

from itertools import product
from typing import Any

import redis.asyncio as aioredis

from controlplane import keys as app_keys
from controlplane.auth.service import ApiKeyService
from controlplane.organizations.models import OrgLimits
from controlplane.organizations.store import WARM_POOL_SHARE, OrganizationStore
from controlplane.sandboxes.admission import MEMBER_CAPS
from controlplane.store import keyspace
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


async def test_a_pool_claims_script_finds_the_caps_member_limits_finds(
    make_sandbox_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    """A warm pool claim reads the member's caps in its own script (MEMBER_CAPS); the cold
    path reads them in Python (Admission.member_limits): the same caps in every case."""
    client = await make_sandbox_client(max_running_per_user=5, max_sandboxes_per_user=7)
    admission = client.app[app_keys.SANDBOXES].admission
    caps = raw_redis.register_script(
        MEMBER_CAPS + "return {member_caps(KEYS[1], KEYS[2], tonumber(ARGV[1]), "
        "tonumber(ARGV[2]), tonumber(ARGV[3]))}"
    )
    store = OrganizationStore(raw_redis)
    await store.create("eng", "Eng", "admin")
    org_key, member_key = keyspace.organization("eng"), keyspace.org_member_limits("eng", "bob")
    size = 3
    cases = product((None, 0, 2), (None, 0, 3), (None, 0, 4), (None, 1), (None, 0.0, 0.34, 1.0))
    for org_running, own_running, org_total, own_total, share in cases:
        await store.set_limits(
            org_key, OrgLimits(max_running_sandboxes=org_running, max_sandboxes=org_total)
        )
        await store.set_limits(
            member_key, OrgLimits(max_running_sandboxes=own_running, max_sandboxes=own_total)
        )
        if share is None:
            await raw_redis.hdel(org_key, WARM_POOL_SHARE)
        else:
            await raw_redis.hset(org_key, WARM_POOL_SHARE, str(share))
        expected = await admission.member_limits("eng", "bob")
        sources = admission.cap_sources("eng", "bob")
        running, total, share_cap = await caps(
            keys=[sources.org, sources.member], args=[sources.running, sources.total, size]
        )
        found = await admission.limits_found(running, total)
        case = (org_running, own_running, org_total, own_total, share)
        assert (found.running, found.total) == (expected.running, expected.total), case
        assert found.memory_capacity == expected.memory_capacity
        wanted_share = -1 if expected.pool_share is None else int(expected.pool_share * size + 1e-9)
        assert share_cap == wanted_share, case
    # No organization named: the default one's limits, as member_limits reads them.
    default = await admission.member_limits(None, "bob")
    sources = admission.cap_sources(None, "bob")
    assert sources.org == keyspace.organization(client.app[app_keys.CONFIG].default_organization)
    running, total, _ = await caps(
        keys=[sources.org, sources.member], args=[sources.running, sources.total, -1]
    )
    assert (running, total) == (default.running, default.total) == (5, 7)
