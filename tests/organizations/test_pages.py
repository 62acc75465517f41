"""Pages of organizations, members and API keys (`limit`, `page_id`): followed to the end they
give every item once, in order; without either parameter the answer is the whole list in the
shape Agent Canvas reads (`items`, `current_org_id`); a bad `limit` or `page_id` is our 422."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection

from controlplane.auth.service import ApiKeyService
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client, ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}


async def call(
    client: Client, path: str, who: dict[str, str], **params: str
) -> tuple[int, dict[str, Any]]:
    async with client.get(path, headers=who, params=params) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body


async def ok(client: Client, method: str, path: str, body: dict[str, Any]) -> None:
    async with client.request(method, path, headers=ADMIN, json=body) as response:
        assert response.status < 300, await response.text()


async def follow(
    client: Client, path: str, who: dict[str, str], limit: int, **params: str
) -> list[list[dict[str, Any]]]:
    """Every page, following next_page_id to the last."""
    pages: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        query = {"limit": str(limit), **params} | ({"page_id": cursor} if cursor else {})
        status, page = await call(client, path, who, **query)
        assert status == 200, page
        assert len(page["items"]) <= limit
        pages.append(page["items"])
        cursor = page["next_page_id"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "the cursor never ends"


async def test_organizations_members_and_keys_page_and_stay_whole_without_paging(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client()
    orgs = [f"org-{i:02d}" for i in range(7)]
    for org in orgs:
        await ok(client, "POST", "/api/organizations", {"id": org, "name": org, "owner": "olivia"})
    members = [f"user{i:02d}" for i in range(9)]
    for user in members:
        await ok(client, "PUT", f"/api/organizations/org-03/members/{user}", {"role": "member"})
    api_keys = ApiKeyService(raw_redis, None)
    olivia = {"X-Session-API-Key": (await api_keys.create("olivia", org_id="org-03")).key}
    made = [
        (await api_keys.create("olivia", name=f"k{i}", org_id="org-03")).key_id for i in range(5)
    ]

    # Organizations: olivia's (she owns all seven) and every one for the admin key, whose list
    # also holds the deployment's default organization.
    whole = await call(client, "/api/organizations", olivia)
    assert whole[0] == 200
    assert set(whole[1]) == {"items", "current_org_id", "next_page_id"}
    assert whole[1]["next_page_id"] is None
    olivias = [o["id"] for o in whole[1]["items"]]
    assert set(orgs) <= set(olivias)
    pages = await follow(client, "/api/organizations", olivia, 3)
    assert [[o["id"] for o in p] for p in pages] == [
        olivias[i : i + 3] for i in range(0, len(olivias), 3)
    ]
    everyone = [o["id"] for o in (await call(client, "/api/organizations", ADMIN))[1]["items"]]
    assert set(orgs) < set(everyone)
    assert everyone == sorted(everyone)
    pages = await follow(client, "/api/organizations", ADMIN, 2)
    assert [o["id"] for p in pages for o in p] == everyone
    assert all(len(p) == 2 for p in pages[:-1])
    # The page's other fields are as in the whole answer.
    status, first = await call(client, "/api/organizations", olivia, limit="1")
    assert status == 200
    assert first["current_org_id"] == whole[1]["current_org_id"]
    assert first["items"] == whole[1]["items"][:1]

    # Members.
    path = "/api/organizations/org-03/members"
    status, whole_members = await call(client, path, olivia)
    assert status == 200
    assert whole_members["next_page_id"] is None
    names = [m["user_id"] for m in whole_members["items"]]
    assert names == sorted([*members, "olivia"])
    pages = await follow(client, path, olivia, 4)
    assert [[m["user_id"] for m in p] for p in pages] == [names[:4], names[4:8], names[8:]]
    assert [m for p in pages for m in p] == whole_members["items"]

    # API keys: oldest first, in pages of offsets.
    status, whole_keys = await call(client, "/api/v1/keys", olivia)
    assert status == 200
    assert whole_keys["next_page_id"] is None
    ids = [k["key_id"] for k in whole_keys["items"]]
    assert set(made) < set(ids)
    pages = await follow(client, "/api/v1/keys", olivia, 2)
    assert [k["key_id"] for p in pages for k in p] == ids
    # Another user's keys, paged, for the deployment admin.
    pages = await follow(client, "/api/v1/keys", ADMIN, 4, user_id="olivia")
    assert [k["key_id"] for p in pages for k in p] == ids


async def test_bad_limits_and_cursors_are_422(make_client: ClientFactory) -> None:
    client = await make_client()
    await ok(client, "POST", "/api/organizations", {"id": "eng", "name": "Eng", "owner": "olivia"})
    paths = {
        "/api/organizations": "ZZ!",  # not an organization id
        "/api/organizations/eng/members": "a b",  # not a user id
        "/api/v1/keys": "k0",  # not an offset
    }
    for path, foreign in paths.items():
        for params, field, kind in (
            ({"limit": "0"}, "limit", "greater_than_equal"),
            ({"limit": "101"}, "limit", "less_than_equal"),
            ({"limit": "x"}, "limit", None),
            ({"page_id": foreign}, "page_id", "string_pattern_mismatch"),
            ({"pages": "2"}, "pages", None),
        ):
            status, body = await call(client, path, ADMIN, **params)
            assert status == 422, (path, params, body)
            assert set(body) == {"detail"}, body
            (item,) = body["detail"]
            assert item["loc"] == ["query", field], (path, params, body)
            if kind is not None:
                assert item["type"] == kind, (path, params, body)
        # An empty page_id is no cursor: the first page, here the whole list.
        status, body = await call(client, path, ADMIN, page_id="")
        assert status == 200, (path, body)
        assert body["next_page_id"] is None


async def test_a_members_page_reads_their_limits_in_one_round_trip(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: a list of members read each one's limits in a round trip of its own, so a list
    of every member made as many round trips as there are members. Now a page's limits are one
    round trip: 4 members or 40 cost Redis the same number (counted at the connection)."""
    client = await make_client()
    await ok(client, "POST", "/api/organizations", {"id": "few", "name": "F", "owner": "olivia"})
    await ok(client, "POST", "/api/organizations", {"id": "many", "name": "M", "owner": "olivia"})
    for org, count in (("few", 3), ("many", 39)):
        for i in range(count):
            limits = {"max_running_sandboxes": i} if i % 5 == 1 else None
            body: dict[str, Any] = {"role": "member"} | ({"limits": limits} if limits else {})
            await ok(client, "PUT", f"/api/organizations/{org}/members/u{i:02d}", body)
    sends = 0
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        nonlocal sends
        sends += 1
        await send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    trips: dict[str, int] = {}
    for org in ("few", "many", "few", "many"):  # the second of each: warm (no first-use reads)
        before = sends
        status, page = await call(client, f"/api/organizations/{org}/members", ADMIN)
        assert status == 200, page
        trips[org] = sends - before
    assert trips["many"] == trips["few"], trips
    # Each member's own limits, where set, are theirs.
    by_user = {m["user_id"]: m["limits"]["max_running_sandboxes"] for m in page["items"]}
    assert len(by_user) == 40
    assert all(by_user[f"u{i:02d}"] == (i if i % 5 == 1 else None) for i in range(39))
