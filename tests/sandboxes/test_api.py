"""The sandbox and spec API: isolation between users, batch gets, inputs, search paging."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from controlplane import keys
from controlplane.api.pagination import encode_cursor
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.naming import new_sandbox_id
from controlplane.sandboxes.store import Limits
from tests.support.sandbox_helpers import (
    DEFAULT_IMAGE,
    HANGING_SPEC,
    REPO,
    OwnDocker,
    start_running,
    wait_status,
)
from tests.support.types import Client, ClientFactory, UserHeaders

ALT_SPEC = (
    (REPO / "specs" / "default.yaml")
    .read_text()
    .replace("id: default", "id: alt")
    .replace("default: true", "default: false")
)
pytestmark = pytest.mark.sbx_specs({"alt": ALT_SPEC, "hanging": HANGING_SPEC})


async def start(client: Client, headers: dict[str, str], **query: str) -> dict[str, Any]:
    resp = await client.post("/api/v1/sandboxes", params=query, headers=headers)
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    assert body["status"] == "STARTING"
    return body


async def search(client: Client, headers: dict[str, str], **query: Any) -> dict[str, Any]:
    resp = await client.get("/api/v1/sandboxes/search", params=query, headers=headers)
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    return body


async def batch(client: Client, headers: dict[str, str], ids: list[str]) -> list[Any]:
    resp = await client.get("/api/v1/sandboxes", params=[("id", i) for i in ids], headers=headers)
    body = await resp.json()
    assert resp.status == 200, body
    assert isinstance(body, list)
    return body


async def put(store: Any, owner: str, status: SandboxStatus, spec_id: str = "default") -> str:
    """Write a record straight into Redis (no container): cheap paging data."""
    now = datetime.now(UTC)
    record = SandboxRecord(
        id=new_sandbox_id(),
        owner=owner,
        spec_id=spec_id,
        status=status,
        reason="test record",
        session_api_key=secrets.token_urlsafe(16),
        created_at=now,
        updated_at=now,
        last_activity_at=now,
    )
    assert await store.create(record, 0, Limits()) == "ok"
    return record.id


async def one(client: Client, headers: dict[str, str], sandbox_id: str) -> dict[str, Any]:
    resp = await client.get(f"/api/v1/sandboxes/{sandbox_id}", headers=headers)
    assert resp.status == 200
    body: dict[str, Any] = await resp.json()
    return body


def assert_422(body: Any, loc: list[str]) -> None:
    assert isinstance(body["detail"], list), body
    assert any(item["loc"] == loc for item in body["detail"]), body


# -- isolation between users --------------------------------------------------------------------


async def test_other_users_get_404_never_403_and_cannot_touch(
    sbx_with_specs: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    running = await start_running(sbx_with_specs, alice)
    sandbox_id = running["id"]

    for method, path in (
        ("GET", f"/api/v1/sandboxes/{sandbox_id}"),
        ("POST", f"/api/v1/sandboxes/{sandbox_id}/pause"),
        ("POST", f"/api/v1/sandboxes/{sandbox_id}/resume"),
        ("DELETE", f"/api/v1/sandboxes/{sandbox_id}"),
    ):
        resp = await sbx_with_specs.request(method, path, headers=bob)
        body = await resp.json()
        assert resp.status == 404, (method, path, body)
        assert body == {"detail": f"sandbox {sandbox_id} not found"}

    assert await search(sbx_with_specs, bob) == {"items": [], "next_page_id": None}
    assert await batch(sbx_with_specs, bob, [sandbox_id]) == [None]
    # Nothing bob tried changed alice's sandbox.
    (container,) = own_docker.containers()
    assert container.status == "running"
    still = await wait_status(sbx_with_specs, alice, sandbox_id, "RUNNING", within=1)
    assert still["session_api_key"] == running["session_api_key"]
    (mine,) = (await search(sbx_with_specs, alice))["items"]
    assert mine["id"] == sandbox_id

    # A non-admin asking for everybody's sandboxes is refused outright.
    resp = await sbx_with_specs.get(
        "/api/v1/sandboxes/search", params={"all_users": "true"}, headers=bob
    )
    assert resp.status == 403
    assert "admin" in (await resp.json())["detail"]


async def test_admin_lists_all_users_without_their_session_keys(
    sbx_with_specs: Client, user_headers: UserHeaders, admin_headers: dict[str, str]
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    ops = await user_headers("ops", admin=True)
    a = (await start(sbx_with_specs, alice))["id"]
    b = (await start(sbx_with_specs, bob))["id"]
    o = (await start(sbx_with_specs, ops, sandbox_spec_id="alt"))["id"]
    keys_of = {
        a: (await wait_status(sbx_with_specs, alice, a, "RUNNING"))["session_api_key"],
        b: (await wait_status(sbx_with_specs, bob, b, "RUNNING"))["session_api_key"],
        o: (await wait_status(sbx_with_specs, ops, o, "RUNNING"))["session_api_key"],
    }
    assert all(keys_of.values())

    for headers, me in ((ops, o), (admin_headers, None)):
        page = await search(sbx_with_specs, headers, all_users="true")
        # Newest first: ids are time-ordered, so that is descending id order (o, b, a).
        assert [i["id"] for i in page["items"]] == sorted([a, b, o], reverse=True)
        assert page["next_page_id"] is None
        for item in page["items"]:
            assert item["status"] == "RUNNING"
            assert item["exposed_urls"], item
            expected = keys_of[item["id"]] if item["id"] == me else None
            assert item["session_api_key"] == expected, item
        owners = {i["id"]: i["created_by_user_id"] for i in page["items"]}
        assert owners == {a: "alice", b: "bob", o: "ops"}

    # Without all_users an admin sees only their own; by id they may read anyone's.
    assert [i["id"] for i in (await search(sbx_with_specs, ops))["items"]] == [o]
    assert (await search(sbx_with_specs, admin_headers))["items"] == []
    seen = await batch(sbx_with_specs, ops, [a, o])
    assert [s["id"] for s in seen] == [a, o]
    assert seen[0]["session_api_key"] is None
    assert seen[1]["session_api_key"] == keys_of[o]
    resp = await sbx_with_specs.get(f"/api/v1/sandboxes/{b}", headers=ops)
    assert resp.status == 200
    assert (await resp.json())["session_api_key"] is None

    # Filters apply across users too.
    page = await search(sbx_with_specs, ops, all_users="true", sandbox_spec_id="alt")
    assert [i["id"] for i in page["items"]] == [o]


async def test_batch_get_keeps_order_and_nulls_the_rest(
    sbx_with_specs: Client, user_headers: UserHeaders
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    store = sbx_with_specs.app[keys.SANDBOXES].store
    mine = [await put(store, "alice", SandboxStatus.ERROR) for _ in range(3)]
    theirs = await put(store, "bob", SandboxStatus.MISSING)
    unknown = new_sandbox_id()

    ids = [mine[2], unknown, mine[0], theirs, "not-an-id", mine[2], mine[1]]
    got = await batch(sbx_with_specs, alice, ids)
    assert [g and g["id"] for g in got] == [mine[2], None, mine[0], None, None, mine[2], mine[1]]
    assert got[0]["status"] == "ERROR"
    assert got[0]["reason"] == "test record"
    assert (await batch(sbx_with_specs, bob, [mine[0], theirs])) == [
        None,
        await one(sbx_with_specs, bob, theirs),
    ]

    resp = await sbx_with_specs.get("/api/v1/sandboxes", headers=alice)
    assert resp.status == 422
    assert_422(await resp.json(), ["query", "id"])
    resp = await sbx_with_specs.get(
        "/api/v1/sandboxes", params=[("id", mine[0])] * 101, headers=alice
    )
    assert resp.status == 422
    assert_422(await resp.json(), ["query", "id"])
    assert len(await batch(sbx_with_specs, alice, [mine[0]] * 100)) == 100
    resp = await sbx_with_specs.get(
        "/api/v1/sandboxes", params={"id": mine[0], "x": "1"}, headers=alice
    )
    assert resp.status == 422


async def test_reads_that_show_no_key_decrypt_only_running_ones(sbx_with_specs: Client) -> None:
    """get_many(keys=False), as batch get and search read: a RUNNING record's session key is
    decrypted (the view shows it to its owner), any other's is left out; keys=True (every
    writer's read) decrypts them all."""
    store = sbx_with_specs.app[keys.SANDBOXES].store
    ids = [await put(store, "alice", status) for status in SandboxStatus]
    full = await store.get_many(ids)
    light = await store.get_many(ids, keys=False)
    for record, seen in zip(full, light, strict=True):
        assert record is not None
        assert seen is not None
        assert record.session_api_key
        running = record.status == SandboxStatus.RUNNING
        assert seen.session_api_key == (record.session_api_key if running else "")
        assert seen.model_dump(exclude={"session_api_key"}) == record.model_dump(
            exclude={"session_api_key"}
        )


# -- inputs -------------------------------------------------------------------------------------


async def test_unknown_spec_is_404_and_creates_nothing(
    sbx_with_specs: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    unknown: list[dict[str, Any]] = [
        {"json": {"sandbox_spec_id": "no-such-spec"}},
        {"params": {"sandbox_spec_id": "no-such-spec"}},
    ]
    for kwargs in unknown:
        resp = await sbx_with_specs.post("/api/v1/sandboxes", headers=alice, **kwargs)
        body = await resp.json()
        assert resp.status == 404, body
        assert body == {"detail": "sandbox spec 'no-such-spec' not found"}
    assert own_docker.containers() == []
    assert await search(sbx_with_specs, alice) == {"items": [], "next_page_id": None}
    assert await sbx_with_specs.app[keys.SANDBOXES].store.count_active("alice") == 0

    # Bad shapes are 422s, also with nothing created.
    bad_shapes: list[dict[str, Any]] = [
        {"json": {"sandbox_spec_id": "x" * 65}},
        {"json": {"spec": "default"}},
        {"json": ["default"]},
        {"params": {"spec": "default"}},
    ]
    for kwargs in bad_shapes:
        resp = await sbx_with_specs.post("/api/v1/sandboxes", headers=alice, **kwargs)
        assert resp.status == 422, (kwargs, await resp.text())
    assert await search(sbx_with_specs, alice) == {"items": [], "next_page_id": None}
    assert own_docker.containers() == []


async def test_spec_in_query_string_and_in_body(
    sbx_with_specs: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    from_query = await start(sbx_with_specs, alice, sandbox_spec_id="alt")
    assert from_query["sandbox_spec_id"] == "alt"
    resp = await sbx_with_specs.post("/api/v1/sandboxes", json={}, headers=alice)
    assert resp.status == 200
    from_default = await resp.json()
    assert from_default["sandbox_spec_id"] == "default"
    running = await wait_status(sbx_with_specs, alice, from_query["id"], "RUNNING")
    assert running["sandbox_spec_id"] == "alt"
    await wait_status(sbx_with_specs, alice, from_default["id"], "RUNNING")
    page = await search(sbx_with_specs, alice, sandbox_spec_id="alt")
    assert [i["id"] for i in page["items"]] == [from_query["id"]]


async def test_malformed_and_unknown_ids_are_404(
    sbx_with_specs: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    for bad in ("not-an-id", "0" * 21, "0" * 23, "A" * 22, "g" * 22, new_sandbox_id()):
        for method, suffix in (
            ("GET", ""),
            ("POST", "/pause"),
            ("POST", "/resume"),
            ("DELETE", ""),
        ):
            resp = await sbx_with_specs.request(
                method, f"/api/v1/sandboxes/{bad}{suffix}", headers=alice
            )
            assert resp.status == 404, (method, bad, await resp.text())
            assert "not found" in (await resp.json())["detail"]


# -- search paging ------------------------------------------------------------------------------


async def walk(client: Client, headers: dict[str, str], limit: int, **query: Any) -> list[str]:
    """Every id over every page; checks page sizes and the final null cursor."""
    ids: list[str] = []
    page_id: str | None = None
    for _ in range(1000):
        params = {"limit": limit, **query}
        if page_id:
            params["page_id"] = page_id
        page = await search(client, headers, **params)
        items = [i["id"] for i in page["items"]]
        page_id = page["next_page_id"]
        if page_id is not None:
            assert len(items) == limit, (limit, query, len(ids))
        else:
            assert len(items) <= limit
        ids += items
        if page_id is None:
            return ids
    raise AssertionError("paging never ended")


async def test_search_pages_newest_first_without_gaps_or_duplicates(
    make_sandbox_client: ClientFactory, user_headers: UserHeaders, admin_headers: dict[str, str]
) -> None:
    # These records have no containers; a sweep would mark RUNNING/PAUSED ones MISSING, so use
    # the statuses it leaves alone (and a long interval besides).
    client: Client = await make_sandbox_client(reconcile_interval=3600)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    store = client.app[keys.SANDBOXES].store
    statuses = [SandboxStatus.ERROR, SandboxStatus.MISSING, SandboxStatus.ERROR]
    specs = ["default", "python-dev"]
    made: list[tuple[str, SandboxStatus, str]] = []
    for n in range(150):
        status, spec = statuses[n % 3], specs[n % 5 % 2]
        made.append((await put(store, "alice", status, spec), status, spec))
        if n % 10 == 0:
            await put(store, "bob", SandboxStatus.ERROR)
    newest_first = sorted((m[0] for m in made), reverse=True)
    assert len(set(newest_first)) == 150

    for limit in range(1, 101):
        assert await walk(client, alice, limit) == newest_first, limit
    default_page = await search(client, alice)
    assert [i["id"] for i in default_page["items"]] == newest_first[:100]

    errors = [i for i, s, _ in sorted(made, reverse=True) if s == SandboxStatus.ERROR]
    missing = [i for i, s, _ in sorted(made, reverse=True) if s == SandboxStatus.MISSING]
    dev = [i for i, _, p in sorted(made, reverse=True) if p == "python-dev"]
    dev_missing = [
        i for i, s, p in sorted(made, reverse=True) if p == "python-dev" and s == "MISSING"
    ]
    assert all((errors, missing, dev, dev_missing))
    for limit in (1, 7, 100):
        assert await walk(client, alice, limit, status="ERROR") == errors
        assert await walk(client, alice, limit, status="MISSING") == missing
        assert await walk(client, alice, limit, sandbox_spec_id="python-dev") == dev
        got = await walk(client, alice, limit, status="MISSING", sandbox_spec_id="python-dev")
        assert got == dev_missing
    assert await walk(client, alice, 10, status="RUNNING") == []
    assert await walk(client, alice, 10, sandbox_spec_id="nope") == []

    # Records arriving between pages do not disturb a walk already under way (they are newer).
    first = await search(client, alice, limit=60)
    extra = [await put(store, "alice", SandboxStatus.ERROR)]
    rest = await walk(client, alice, 60, page_id=first["next_page_id"])
    assert [i["id"] for i in first["items"]] + rest == newest_first

    bobs = await walk(client, bob, 3)
    assert len(bobs) == 15
    assert not set(bobs) & set(newest_first)
    everyone = await walk(client, admin_headers, 100, all_users="true")
    assert everyone == sorted([*newest_first, *bobs, *extra], reverse=True)

    for bad in ("0", "101", "-1", "abc", "1.5", ""):
        resp = await client.get("/api/v1/sandboxes/search", params={"limit": bad}, headers=alice)
        assert resp.status == 422, (bad, await resp.text())
        assert_422(await resp.json(), ["query", "limit"])
    for bad in ("zzzz", "%%%", "not-a-cursor", "!!!", encode_cursor("hello"), "x" * 600):
        resp = await client.get("/api/v1/sandboxes/search", params={"page_id": bad}, headers=alice)
        assert resp.status == 422, (bad, await resp.text())
        assert_422(await resp.json(), ["query", "page_id"])
    for bad_query in ({"status": "SLEEPING"}, {"all_users": "maybe"}, {"owner": "bob"}):
        resp = await client.get("/api/v1/sandboxes/search", params=bad_query, headers=alice)
        assert resp.status == 422, (bad_query, await resp.text())


# -- sandbox specs ------------------------------------------------------------------------------


async def test_spec_search_batch_and_paging(
    sbx_with_specs: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    resp = await sbx_with_specs.get("/api/v1/sandbox-specs/search", headers=alice)
    assert resp.status == 200
    page = await resp.json()
    assert [s["id"] for s in page["items"]] == ["alt", "default", "hanging"]
    assert page["next_page_id"] is None
    default = page["items"][1]
    assert default["default"] is True
    assert default["image"] == DEFAULT_IMAGE
    assert default["exposed_ports"] == {"AGENT_SERVER": 8000}
    assert default["working_dir"] == "/workspace"
    assert default["resources"] == {
        "cpus": 1.0,
        "memory": "1g",
        "pids": 512,
        "memory_reservation": "64m",
    }
    assert [s["default"] for s in page["items"]] == [False, True, False]

    ids, page_id, pages = [], None, 0
    while True:
        params = {"limit": "1"} | ({"page_id": page_id} if page_id else {})
        resp = await sbx_with_specs.get(
            "/api/v1/sandbox-specs/search", params=params, headers=alice
        )
        assert resp.status == 200
        body = await resp.json()
        assert len(body["items"]) == 1
        ids.append(body["items"][0]["id"])
        pages += 1
        page_id = body["next_page_id"]
        if page_id is None:
            break
    assert (ids, pages) == (["alt", "default", "hanging"], 3)
    resp = await sbx_with_specs.get(
        "/api/v1/sandbox-specs/search", params={"limit": 2}, headers=alice
    )
    two = await resp.json()
    assert [s["id"] for s in two["items"]] == ["alt", "default"]
    resp = await sbx_with_specs.get(
        "/api/v1/sandbox-specs/search",
        params={"limit": 2, "page_id": two["next_page_id"]},
        headers=alice,
    )
    assert [s["id"] for s in (await resp.json())["items"]] == ["hanging"]

    resp = await sbx_with_specs.get(
        "/api/v1/sandbox-specs",
        params=[("id", "hanging"), ("id", "nope"), ("id", "default"), ("id", "")],
        headers=alice,
    )
    assert resp.status == 200
    got = await resp.json()
    assert [g and g["id"] for g in got] == ["hanging", None, "default", None]
    assert got[0]["command"] == ["sleep", "1000"]

    resp = await sbx_with_specs.get("/api/v1/sandbox-specs", headers=alice)
    assert resp.status == 422
    resp = await sbx_with_specs.get(
        "/api/v1/sandbox-specs", params=[("id", "a")] * 101, headers=alice
    )
    assert resp.status == 422
    for bad in ({"limit": "0"}, {"limit": "101"}, {"page_id": "ZZZZ"}):
        resp = await sbx_with_specs.get("/api/v1/sandbox-specs/search", params=bad, headers=alice)
        assert resp.status == 422, bad
    resp = await sbx_with_specs.get("/api/v1/sandbox-specs/search")
    assert resp.status == 401
