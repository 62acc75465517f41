"""A request's API key and its user's organizations are read in one Redis round trip (one
script, ApiKeyService.authenticate_with_orgs), and nothing of either is kept between requests: a
revoked or suspended key is refused at once, and so is a member removed from an organization."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.organizations.roles import Role
from controlplane.organizations.store import OrganizationStore
from controlplane.store import keyspace
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}


async def _calls(redis: aioredis.Redis) -> dict[str, int]:
    stats: Any = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


async def test_key_and_memberships_come_from_one_script_call(raw_redis: aioredis.Redis) -> None:
    keys, orgs = ApiKeyService(raw_redis, BOOTSTRAP_KEY), OrganizationStore(raw_redis)
    await orgs.create("eng", "Eng", "admin")
    await orgs.set_role("eng", "bob", Role.ADMIN)
    created = await keys.create("bob", org_id="eng")
    await keys.authenticate_with_orgs(created.key)  # the script loaded once (EVALSHA after)

    await raw_redis.config_resetstat()
    principal, memberships = await keys.authenticate_with_orgs(created.key)
    calls = await _calls(raw_redis)
    assert (principal.user_id, principal.key_id, principal.key_org_id) == (
        "bob",
        created.key_id,
        "eng",
    )
    assert memberships == await orgs.memberships("bob")
    assert memberships is not None
    assert memberships["eng"] == "admin"
    # One command sent (the script); its two HGETALLs ran inside it, in Redis.
    assert calls.pop("evalsha_ro") == 1
    assert calls.pop("hgetall") == 2
    assert set(calls) <= {"config|resetstat", "info"}, calls

    # The bootstrap key reads nothing; a user without memberships reads an empty hash.
    assert await keys.authenticate_with_orgs(BOOTSTRAP_KEY) == (
        await keys.authenticate(BOOTSTRAP_KEY),
        None,
    )
    carl = await keys.create("carl")
    assert (await keys.authenticate_with_orgs(carl.key))[1] == {}


async def test_a_wrong_secret_is_refused_though_the_key_id_and_user_exist(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    created = await ApiKeyService(raw_redis, None).create("dora")
    assert (await client.get("/api/settings", headers={"X-Session-API-Key": created.key})).status
    wrong = created.key[:-4] + ("AAAA" if not created.key.endswith("AAAA") else "BBBB")
    response = await client.get("/api/settings", headers={"X-Session-API-Key": wrong})
    assert response.status == 401
    assert (await response.json())["detail"] == "invalid API key"
    # A record without its hash (never written so; e.g. damaged) refuses as well.
    await raw_redis.hdel(keyspace.api_key(created.key_id), "hash")
    response = await client.get("/api/settings", headers={"X-Session-API-Key": created.key})
    assert response.status == 401


async def test_revoked_suspended_and_removed_count_at_the_next_request(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    async def status(path: str, headers: dict[str, str], method: str = "GET") -> int:
        async with client.request(method, path, headers=headers) as response:
            return response.status

    made = {"id": "eng", "name": "Eng", "owner": "olivia"}
    assert (await client.post("/api/organizations", json=made, headers=ADMIN)).status == 201
    member = {"role": "member"}
    put = await client.put("/api/organizations/eng/members/bob", json=member, headers=ADMIN)
    assert put.status == 200
    keys = ApiKeyService(raw_redis, None)
    bob_key = await keys.create("bob", org_id="eng")
    bob = {"X-Session-API-Key": bob_key.key}
    in_eng = bob | {"X-Org-Id": "eng"}
    me = await client.get("/api/organizations/eng/me", headers=in_eng)
    assert me.status == 200
    assert (await me.json())["role"] == "member"

    # Removed: the very next request in that organization is refused (as one that is not his).
    assert await status("/api/organizations/eng/members/bob", ADMIN, "DELETE") == 200
    assert await status("/api/organizations/eng/me", in_eng) == 404
    assert await status("/api/settings", in_eng) == 404
    # Added again, with another role: seen at once too.
    admin_role = {"role": "admin"}
    put = await client.put("/api/organizations/eng/members/bob", json=admin_role, headers=ADMIN)
    assert put.status == 200
    me = await client.get("/api/organizations/eng/me", headers=in_eng)
    assert (await me.json())["role"] == "admin"

    # Suspended (the provider refused the user), then restored: each at the next request.
    await keys.set_suspended("bob", True)
    assert await status("/api/settings", bob) == 401
    await keys.set_suspended("bob", False)
    assert await status("/api/settings", bob) == 200
    # Revoked: refused at the next request.
    await keys.revoke(bob_key.key_id)
    assert await status("/api/settings", bob) == 401
    assert await status("/api/organizations/eng/me", in_eng) == 401
