"""A browser session's record, the liveness of the API key it was opened with and its user's
organizations are read in one Redis round trip (SessionService.resolve_with_orgs), as an API
key's are; nothing is kept between requests: a revoked or suspended key, a signed-out session
or a removed membership counts at the very next request."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.models import Principal
from controlplane.auth.service import BOOTSTRAP_KEY_ID, ApiKeyService
from controlplane.auth.sessions import COOKIE_NAME, SessionService
from controlplane.organizations.roles import Role
from controlplane.organizations.store import OrganizationStore
from tests.auth.test_sessions import origin, set_cookie, sign_in
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}


async def _calls(redis: aioredis.Redis) -> dict[str, int]:
    stats: Any = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


async def test_session_key_and_memberships_come_from_one_script_call(
    raw_redis: aioredis.Redis,
) -> None:
    api_keys, orgs = ApiKeyService(raw_redis, BOOTSTRAP_KEY), OrganizationStore(raw_redis)
    sessions = SessionService(raw_redis, api_keys, b"k" * 32, 3600)
    await orgs.create("eng", "Eng", "admin")
    await orgs.set_role("eng", "bob", Role.ADMIN)
    created = await api_keys.create("bob")
    bob = await api_keys.authenticate(created.key)
    cookie = (await sessions.create(bob)).cookie
    await sessions.resolve_with_orgs(cookie)  # the script loaded once (EVALSHA after)

    await raw_redis.config_resetstat()
    found = await sessions.resolve_with_orgs(cookie)
    calls = await _calls(raw_redis)
    assert found is not None
    principal, memberships = found
    assert (principal.user_id, principal.key_id, principal.via) == (
        "bob",
        created.key_id,
        "session",
    )
    assert memberships == await orgs.memberships("bob")
    assert memberships is not None
    assert memberships["eng"] == "admin"
    # One command sent (the script); the session, the key and the memberships read inside it.
    assert calls.pop("evalsha_ro") == 1
    assert (calls.pop("hgetall"), calls.pop("exists"), calls.pop("hexists")) == (2, 1, 1)
    assert set(calls) <= {"config|resetstat", "info"}, calls

    # The key suspended (the provider refused its user): the session is refused while it is,
    # as the key's own requests are; restored, it is live again.
    await api_keys.set_suspended("bob", True)
    assert await sessions.resolve_with_orgs(cookie) is None
    await api_keys.set_suspended("bob", False)
    assert await sessions.resolve(cookie) == principal

    # The key revoked: the session is over at once; signed out: too.
    await api_keys.revoke(created.key_id)
    assert await sessions.resolve_with_orgs(cookie) is None
    again = await api_keys.create("bob")
    cookie = (await sessions.create(await api_keys.authenticate(again.key))).cookie
    assert await sessions.resolve(cookie) is not None
    assert await sessions.revoke(cookie)
    assert await sessions.resolve_with_orgs(cookie) is None

    # A session opened with the bootstrap key lives while that key is configured (not stored).
    admin = Principal(user_id="admin", is_admin=True, key_id=BOOTSTRAP_KEY_ID)
    cookie = (await sessions.create(admin)).cookie
    assert (await sessions.resolve_with_orgs(cookie) or (None, None))[0] == admin.model_copy(
        update={"via": "session"}
    )
    unconfigured = SessionService(raw_redis, ApiKeyService(raw_redis, None), b"k" * 32, 3600)
    assert await unconfigured.resolve_with_orgs(cookie) is None

    # An OpenID session is not tied to a key; once its provider check is due, what the check
    # may have changed (the user's organizations) is read again by the caller.
    checked: list[str] = []

    async def recheck(record_key: str, row: dict[Any, Any]) -> bool:
        checked.append(record_key)
        return True

    oidc = SessionService(raw_redis, api_keys, b"k" * 32, 3600, recheck)
    fields = {"user_id": "bob", "key_id": "oidc-key", "is_admin": "0", "via": "oidc"}
    later = await oidc.open(fields | {"recheck_at": str(time.time() + 600)})
    assert await oidc.resolve_with_orgs(later.cookie) == (
        Principal(user_id="bob", is_admin=False, key_id="oidc-key", via="oidc"),
        memberships,
    )
    due = await oidc.open(fields | {"recheck_at": "0"})
    found = await oidc.resolve_with_orgs(due.cookie)
    assert found is not None
    assert (found[1], len(checked)) == (None, 1)


async def test_a_browser_sees_a_removed_membership_at_its_next_request(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    made = {"id": "eng", "name": "Eng", "owner": "olivia"}
    assert (await client.post("/api/organizations", json=made, headers=ADMIN)).status == 201
    put = await client.put(
        "/api/organizations/eng/members/bob", json={"role": "member"}, headers=ADMIN
    )
    assert put.status == 200
    key = (await ApiKeyService(raw_redis, None).create("bob")).key
    client.session.cookie_jar.clear()
    cookie = set_cookie(await sign_in(client, key))[COOKIE_NAME].value
    browser = {"Cookie": f"{COOKIE_NAME}={cookie}", "X-Org-Id": "eng"} | origin(client)
    me = await client.get("/api/organizations/eng/me", headers=browser)
    assert me.status == 200
    assert (await me.json())["role"] == "member"

    delete = await client.delete("/api/organizations/eng/members/bob", headers=ADMIN)
    assert delete.status == 200
    assert (await client.get("/api/organizations/eng/me", headers=browser)).status == 404
    put = await client.put(
        "/api/organizations/eng/members/bob", json={"role": "admin"}, headers=ADMIN
    )
    assert put.status == 200
    me = await client.get("/api/organizations/eng/me", headers=browser)
    assert (await me.json())["role"] == "admin"


async def test_a_browser_signed_in_with_a_key_the_provider_refused_is_refused(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    """A session opened with an API key ends with that key's suspension (the OpenID provider
    refused its user: docs/security.md), at the browser's next request, not at its expiry."""
    api_keys = ApiKeyService(raw_redis, None)
    key = (await api_keys.create("carol")).key
    client.session.cookie_jar.clear()
    cookie = set_cookie(await sign_in(client, key))[COOKIE_NAME].value
    browser = {"Cookie": f"{COOKIE_NAME}={cookie}"} | origin(client)
    assert (await client.get("/api/settings", headers=browser)).status == 200

    await api_keys.set_suspended("carol", True)
    assert (await client.get("/api/settings", headers=browser)).status == 401
    assert (await client.get("/api/settings", headers={"X-Session-API-Key": key})).status == 401
    await api_keys.set_suspended("carol", False)
    assert (await client.get("/api/settings", headers=browser)).status == 200
