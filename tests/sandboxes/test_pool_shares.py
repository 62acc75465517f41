"""Warm-pool shares per organization, with real Docker and Redis: an organization whose owner
gave it half the pool claims at most half of it in a burst (its other creates start cold), and
another organization still finds warm members; only owners and admins set a share."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from tests.conftest import BOOTSTRAP_KEY
from tests.sandboxes.test_warm_pool import FAST, create, wait_ready
from tests.support.sandbox_helpers import OwnDocker
from tests.support.types import Client, ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}


async def call(client: Client, method: str, path: str, who: dict[str, str], **kw: Any) -> Any:
    async with client.request(method, path, headers=who, **kw) as resp:
        return resp.status, await resp.json()


async def test_an_organization_takes_only_its_share_of_the_pool_in_a_burst(
    own_docker: OwnDocker, make_sandbox_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_sandbox_client(warm_pool="4", max_running_per_user=10, **FAST)
    for org, owner in (("eng", "olivia"), ("sales", "sam")):
        made = {"id": org, "name": org, "owner": owner}
        assert (await call(client, "POST", "/api/organizations", ADMIN, json=made))[0] == 201
    members = ["e1", "e2", "e3", "e4"]
    for user in members:
        path = f"/api/organizations/eng/members/{user}"
        assert (await call(client, "PUT", path, ADMIN, json={"role": "member"}))[0] == 200
    keys = ApiKeyService(raw_redis, None)
    who = {
        user: {"X-Session-API-Key": (await keys.create(user, org_id=org)).key}
        for user, org in [*((m, "eng") for m in members), ("olivia", "eng"), ("sam", "sales")]
    }

    # Set by the organization's owner, not by a member; a share is a part: 0 to 1.
    share = {"warm_pool_share": 0.5}
    assert (await call(client, "PATCH", "/api/organizations/eng", who["e1"], json=share))[0] == 403
    bad = {"warm_pool_share": 1.5}
    assert (await call(client, "PATCH", "/api/organizations/eng", who["olivia"], json=bad))[
        0
    ] == 422
    status, org = await call(client, "PATCH", "/api/organizations/eng", who["olivia"], json=share)
    assert status == 200, org
    assert org["warm_pool_share"] == 0.5

    warm = await wait_ready(client, 4)
    # A burst of four creates in eng: two (half the pool of 4) get warm members, two start cold.
    bodies = await asyncio.gather(*(create(client, who[m]) for m in members))
    claimed = [b["id"] for b in bodies if b["id"] in warm]
    assert len(claimed) == 2, bodies
    assert all(b["id"] not in warm for b in bodies if b["id"] not in claimed)
    # sales has no share of its own: the members eng left are there for it.
    theirs = await create(client, who["sam"])
    assert theirs["id"] in warm - set(claimed)
    metrics = await (await client.get("/metrics", headers=ADMIN)).text()
    assert 'acs_pool_share_misses_total{spec="default"} 2.0' in metrics

    # The share removed (null), eng claims warm members again.
    status, org = await call(
        client, "PATCH", "/api/organizations/eng", who["olivia"], json={"warm_pool_share": None}
    )
    assert status == 200, org
    assert org["warm_pool_share"] is None
    left = warm - set(claimed) - {theirs["id"]}
    again = await create(client, who["olivia"])
    assert again["id"] in left
