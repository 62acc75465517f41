"""An auditor of one organization learns nothing of another's audit entries: not through its
filters (a user or a target of both, or of the other one only), not through its cursors (their
number, their values, whether a page has one), not through time windows, and a cursor that is
not its own search's is refused. The attack: everything the auditor of `eng` can ask, asked
before and after `sales` (where a user of both acts too) writes thousands of entries; every
answer must stay the same."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace, text
from controlplane.store.audit import AuditLog, new_id
from controlplane.store.audit_event import AuditRecord
from controlplane.store.audit_index import AuditIndexer
from controlplane.store.streams import StreamEntry
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
SEARCH = "/api/v1/audit-events/search"


async def call(client: Client, who: dict[str, str], params: dict[str, str]) -> tuple[int, Any]:
    async with client.get(SEARCH, headers=who, params=params) as resp:
        return resp.status, await resp.json()


async def pages(client: Client, who: dict[str, str], **params: str) -> list[Any]:
    """Every page of a search (with its cursor), following the cursors."""
    found: list[Any] = []
    page_id = None
    while True:
        status, page = await call(client, who, params | ({"page_id": page_id} if page_id else {}))
        assert status == 200, page
        found.append(page)
        page_id = page["next_page_id"]
        if page_id is None:
            return found


def seen(found: list[Any]) -> list[tuple[list[str], bool]]:
    """What a reader can compare between two runs: each page's entries, and whether it has a
    next one (the cursors' values are sealed with a fresh nonce each time)."""
    return [([e["event"]["id"] for e in p["items"]], p["next_page_id"] is not None) for p in found]


async def sales_floods(redis: aioredis.Redis, count: int) -> None:
    """`count` entries of `sales` by `x` (a member of both) on `x` and on `s1`, written by the
    audit log's own writer."""
    log = AuditLog(redis, retention=86400)
    now_ms = int(time.time() * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(count):
            record = AuditRecord(
                id=new_id(now_ms + n),
                time_ms=now_ms + n,
                action="member.set",
                outcome="success",
                user_id="x",
                key_id=None,
                via="api_key",
                admin=False,
                org_id="sales",
                role="admin",
                targets={"user_id": "x" if n % 2 else "s1"},
            )
            StreamEntry((log.adds(record),)).queue(pipe)
        await pipe.execute()


async def test_an_auditor_learns_nothing_of_another_organization(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    for org, owner in (("eng", "olivia"), ("sales", "sam")):
        async with client.post(
            "/api/organizations", headers=ADMIN, json={"id": org, "name": org, "owner": owner}
        ) as resp:
            assert resp.status == 201
    for org, user, role in (
        ("eng", "aud", "auditor"),
        ("eng", "x", "admin"),
        ("sales", "x", "admin"),
        ("sales", "s1", "member"),
    ):
        async with client.put(
            f"/api/organizations/{org}/members/{user}", headers=ADMIN, json={"role": role}
        ) as resp:
            assert resp.status == 200
    keys = ApiKeyService(raw_redis, None)
    aud = {"X-Session-API-Key": (await keys.create("aud", org_id="eng")).key}
    sam = {"X-Session-API-Key": (await keys.create("sam", org_id="sales")).key}
    x_eng = {"X-Session-API-Key": (await keys.create("x", org_id="eng")).key}
    x_sales = {"X-Session-API-Key": (await keys.create("x", org_id="sales")).key}
    # x acts in both: a member changed in each.
    for who, org, user in ((x_eng, "eng", "u-eng"), (x_eng, "eng", "v-eng"),
                           (x_sales, "sales", "u-sales")):  # fmt: skip
        async with client.put(
            f"/api/organizations/{org}/members/{user}", headers=who, json={"role": "member"}
        ) as resp:
            assert resp.status == 200

    queries: list[dict[str, str]] = [
        {},
        {"limit": "1"},
        {"user_id": "x", "limit": "1"},
        {"user_id": "x"},
        {"user_id": "sam"},
        {"user_id": "s1"},
        {"target": "x", "limit": "1"},
        {"target": "s1"},
        {"target": "u-sales"},
        {"action": "member.set", "limit": "1"},
        {"user_id": "x", "action": "member.set"},
        {"since": "2020-01-01T00:00:00Z", "limit": "2"},
    ]
    indexer = AuditIndexer(raw_redis, retention=86400)
    # Indexed, as every replica's indexer does within a fraction of a second: until then a
    # search also reads the log's un-indexed tail (docs/operations.md, the audit log), where a
    # page may end with a cursor to an empty one.
    await indexer.catch_up()
    before = [seen(await pages(client, aud, **q)) for q in queries]
    # eng's own entries are found; nothing of sales is, however the auditor filters.
    assert before[3]
    assert before[3][0][0]
    for q, answer in zip(queries, before, strict=True):
        if q.get("user_id") in ("sam", "s1") or q.get("target") in ("s1", "u-sales"):
            assert answer == [([], False)], q

    await sales_floods(raw_redis, 2500)  # more than a page reads past its filters (2000)
    await indexer.catch_up()
    after = [seen(await pages(client, aud, **q)) for q in queries]
    assert after == before

    # Cursors: nothing in them is a stream id (an entry's time), and only the search that made
    # one takes it.
    async def cursor_of(who: dict[str, str], **params: str) -> str:
        status, page = await call(client, who, params | {"limit": "1"})
        assert status == 200, page
        assert page["next_page_id"], page
        return str(page["next_page_id"])

    cursor = await cursor_of(aud, user_id="x")
    rows: Any = await raw_redis.xrange(keyspace.audit_org("sales"))
    sales_ids = [text(i) for i, _ in rows]
    assert not any(i.split("-")[0] in cursor for i in sales_ids)
    for page_id, who, params in (
        (sales_ids[-1], aud, {"user_id": "x"}),  # a position chosen by the attacker
        (cursor, aud, {"user_id": "aud"}),  # their own cursor on another search
        (await cursor_of(sam), aud, {}),  # sales's own cursor
        (await cursor_of(ADMIN), aud, {}),  # the deployment admin's
        (cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB"), aud, {"user_id": "x"}),
    ):
        status, body = await call(client, who, params | {"page_id": page_id, "limit": "1"})
        assert status == 422, (page_id, body)
    # Another organization named outright is not found.
    assert (await call(client, aud, {"org_id": "sales"}))[0] == 404
    # The deployment admin's search still finds sales's entries of x (its own indexes).
    status, everything = await call(client, ADMIN, {"user_id": "x", "limit": "100"})
    assert status == 200
    assert {e["organization"]["id"] for e in everything["items"]} == {"sales"}
