"""A search of every user's sandboxes in a status few are in reads those few, not the
deployment (issue 30, item 4: nothing per request grows with every sandbox there is). The
records such a search must not need are made unreadable here, so a request that read them would
fail with a 500."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.auth.service import ApiKeyService
from controlplane.sandboxes import reads
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.conftest import BOOTSTRAP_KEY
from tests.sandboxes.test_api import put, walk
from tests.support.records import NO_ENGINE, sandbox_record
from tests.support.types import Client, ClientFactory, UserHeaders


@pytest.fixture
async def search_client(make_client: ClientFactory) -> Client:
    """An app with sandboxes whose engine nothing answers (a search never reaches it), no sweep."""
    return await make_client(with_sandboxes=True, docker_url=NO_ENGINE, reconcile_interval=3600)


async def seed(store: SandboxStore) -> tuple[list[str], list[str]]:
    """450 MISSING records of three users and, among them, 5 ERROR ones: (errors, missing),
    each newest first."""
    errors: list[str] = []
    missing: list[str] = []
    for n in range(450):
        owner = ("alice", "bob", "carol")[n % 3]
        if n % 90 == 45:
            errors.append(await put(store, owner, SandboxStatus.ERROR))
        missing.append(await put(store, owner, SandboxStatus.MISSING))
    return sorted(errors, reverse=True), sorted(missing, reverse=True)


async def test_rare_status_of_every_user_reads_only_its_records(
    search_client: Client, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    store = search_client.app[keys.SANDBOXES].store
    errors, missing = await seed(store)
    # Every record not in ERROR is made unreadable: its status no status has (the sets, which
    # every writer keeps with the status, still list it as MISSING).
    for sandbox_id in missing:
        await raw_redis.hset(keyspace.sandbox(sandbox_id), "status", "UNREADABLE")
    for limit in (1, 2, 5, 100):
        got = await walk(search_client, admin_headers, limit, all_users="true", status="ERROR")
        assert got == errors, limit


async def test_a_large_status_set_is_paged_through_the_index(
    search_client: Client,
    admin_headers: dict[str, str],
    user_headers: UserHeaders,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past STATUS_SET_READ the set is not read whole: the index is paged as before, with the
    same pages; an owner's own search never reads the set."""
    store = search_client.app[keys.SANDBOXES].store
    errors, missing = await seed(store)
    by_set = {
        s: await walk(search_client, admin_headers, 7, all_users="true", status=s)
        for s in ("ERROR", "MISSING")
    }
    monkeypatch.setattr(reads, "STATUS_SET_READ", 4)
    by_index = {
        s: await walk(search_client, admin_headers, 7, all_users="true", status=s)
        for s in ("ERROR", "MISSING")
    }
    assert by_set == by_index == {"ERROR": errors, "MISSING": missing}
    alice = await user_headers("alice")
    owners = dict(zip(missing, await store.get_many(missing), strict=True))
    alices = [i for i, r in owners.items() if r is not None and r.owner == "alice"]
    assert await walk(search_client, alice, 50, status="MISSING") == alices
    assert len(alices) == 150


async def test_an_organization_owner_pages_its_few_among_many_in_the_status(
    search_client: Client, raw_redis: aioredis.Redis
) -> None:
    """The status's set holds every organization's: an owner's page reads on, in doubling
    batches, past the others' until it is filled, each of its own once and in order."""
    resp = await search_client.post(
        "/api/organizations",
        json={"id": "eng", "name": "Eng", "owner": "olivia"},
        headers={"X-Session-API-Key": BOOTSTRAP_KEY},
    )
    assert resp.status < 300, await resp.text()
    olivia = {
        "X-Session-API-Key": (
            await ApiKeyService(raw_redis, None).create("olivia", org_id="eng")
        ).key
    }
    store = search_client.app[keys.SANDBOXES].store
    ours: list[str] = []
    for n in range(300):
        record = sandbox_record(("alice", "bob")[n % 2], SandboxStatus.ERROR)
        if n % 37 == 5:
            record.org_id = "eng"
            ours.append(record.id)
        assert await store.create(record, 0, Limits()) == "ok"
    ours.sort(reverse=True)
    assert len(ours) == 8
    for limit in (1, 3, 100):
        got = await walk(search_client, olivia, limit, all_users="true", status="ERROR")
        assert got == ours, limit
