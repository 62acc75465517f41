"""The audit log through the API, on real Redis: what each kind of action leaves (who, what, when,
from where, how it ended), who may search it (docs/api.md#audit-events), its filters, paging and
JSON-lines export, and that no key or secret the test used appears anywhere in what is stored."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace, text
from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
SEARCH = "/api/v1/audit-events/search"
AGENT = "audit-test/1.0"
LLM_KEY = "sk-audit-test-llm-key-0123456789abcdef"
SECRET_VALUE = "db-password-that-must-not-leak-7f3a"
PROVIDER_TOKEN = "ghp_auditTestProviderToken0123456789AB"


async def ok(client: Client, method: str, path: str, who: dict[str, str], **kw: Any) -> Any:
    async with client.request(method, path, headers=who | {"User-Agent": AGENT}, **kw) as resp:
        body = await resp.json()
        assert resp.status < 300, (method, path, resp.status, body)
        return body


async def status(client: Client, method: str, path: str, who: dict[str, str], **kw: Any) -> int:
    async with client.request(method, path, headers=who | {"User-Agent": AGENT}, **kw) as resp:
        await resp.read()
        return resp.status


async def search(client: Client, who: dict[str, str], **params: str) -> list[dict[str, Any]]:
    """Every entry the search finds, following its cursor."""
    items: list[dict[str, Any]] = []
    page_id = None
    while True:
        query = params | ({"page_id": page_id} if page_id else {})
        page = await ok(client, "GET", SEARCH, who, params=query)
        items += page["items"]
        page_id = page["next_page_id"]
        if page_id is None:
            return items


@pytest.fixture
async def org(client: Client, raw_redis: aioredis.Redis) -> dict[str, dict[str, str]]:
    """eng: olivia owner, ada admin, bob member, aud auditor; sales: sam owner. Each user's
    first key is made as `controlplane keys create` makes it, then they make the one they use
    through the API (so that key is in the log)."""
    await ok(client, "POST", "/api/organizations", ADMIN, json={"id": "eng", "name": "Eng",
                                                                 "owner": "olivia"})  # fmt: skip
    await ok(client, "POST", "/api/organizations", ADMIN, json={"id": "sales", "name": "Sales",
                                                                 "owner": "sam"})  # fmt: skip
    for user, role in (("ada", "admin"), ("bob", "member"), ("aud", "auditor")):
        await ok(client, "PUT", f"/api/organizations/eng/members/{user}", ADMIN,
                 json={"role": role})  # fmt: skip
    headers = {}
    for user in ("olivia", "ada", "bob", "aud", "sam"):
        first = await ApiKeyService(raw_redis, None).create(user)
        made = await ok(client, "POST", "/api/v1/keys", {"X-Session-API-Key": first.key},
                        json={"name": "script"})  # fmt: skip
        headers[user] = {"X-Session-API-Key": made["key"]}
    return headers


async def stored_text(redis: aioredis.Redis) -> str:
    """Everything the audit log holds in Redis (entries, indexes, sink outboxes), as text."""
    parts = []
    async for key in redis.scan_iter(match=f"{keyspace.PREFIX}:audit*"):
        parts.append(text(key))
        kind = text(await redis.type(key))
        if kind == "zset":  # a target's index, the windows awaiting a summary
            parts += [text(m) for m in await redis.zrange(key, 0, -1)]
            continue
        if kind == "string":  # the anonymous-failure gate's counters (and its HyperLogLogs)
            value: Any = await redis.get(key)
            parts.append(bytes(value or b"").decode(errors="replace"))
            continue
        rows: Any = await redis.xrange(key)
        for entry_id, fields in rows:
            parts.append(text(entry_id))
            parts += [text(k) + "=" + text(v) for k, v in fields.items()]
    return "\n".join(parts)


async def test_actions_have_entries_with_who_what_where_and_result(
    client: Client, org: dict[str, dict[str, str]], raw_redis: aioredis.Redis
) -> None:
    now = datetime.now(UTC)
    # The entries' @timestamp is to the millisecond: an action in the same millisecond as this
    # line is stamped before its microseconds.
    started = now.replace(microsecond=now.microsecond // 1000 * 1000)
    ada, bob = org["ada"], org["bob"]
    key = await ok(client, "POST", "/api/v1/keys", bob, json={"name": "ci"})
    await ok(client, "DELETE", f"/api/v1/keys/{key['key_id']}", ada)
    assert await status(client, "PUT", "/api/organizations/eng/members/aud", bob,
                        json={"role": "admin"}) == 403  # fmt: skip
    await ok(client, "PUT", "/api/organizations/eng/members/bob", ada, json={"role": "admin"})

    entries = await search(client, ADMIN, since=started.isoformat())
    by_action: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_action.setdefault(entry["event"]["action"], []).append(entry)

    made = [e for e in by_action["key.create"] if e["acs"]["targets"]["key_id"] == key["key_id"]]
    assert len(made) == 1
    (created,) = made
    assert created["user"]["id"] == "bob"
    assert created["organization"]["id"] == "eng"
    assert created["event"]["outcome"] == "success"
    assert created["source"]["ip"] == "127.0.0.1"
    assert created["user_agent"]["original"] == AGENT
    assert created["acs"]["auth"] == "api_key"
    assert created["acs"]["key_id"]  # the key bob called with
    stamp = datetime.fromisoformat(created["@timestamp"])
    assert started <= stamp <= datetime.now(UTC)

    (revoked,) = by_action["key.revoke"]
    assert revoked["user"]["id"] == "ada"
    assert revoked["acs"]["targets"] == {"key_id": key["key_id"], "user_id": "bob"}

    (refused,) = [e for e in by_action["member.set"] if e["event"]["outcome"] == "failure"]
    assert refused["user"]["id"] == "bob"
    assert refused["event"]["reason"] == "forbidden"
    assert refused["http"]["response"]["status_code"] == 403
    assert refused["acs"]["targets"] == {"org_id": "eng", "user_id": "aud"}

    promoted = [
        e
        for e in by_action["member.set"]
        if e["event"]["outcome"] == "success" and e["acs"]["targets"]["user_id"] == "bob"
    ]
    assert [(e["user"]["id"], e["acs"]["details"]) for e in promoted] == [
        ("ada", {"role": "admin", "previous": "member"})
    ]
    # Newest first.
    stamps = [e["@timestamp"] for e in entries]
    assert stamps == sorted(stamps, reverse=True)


async def test_sign_ins_and_failed_sign_ins(client: Client, raw_redis: aioredis.Redis) -> None:
    origin = {"Origin": str(client.make_url("")).rstrip("/")}
    assert await status(client, "POST", "/auth/sign-in", origin,
                        json={"api_key": "acs_000000000000_" + "x" * 43}) == 401  # fmt: skip
    await ok(client, "POST", "/auth/sign-in", origin, json={"api_key": BOOTSTRAP_KEY})
    entries = await search(client, ADMIN, action="auth.sign_in")
    assert [(e["event"]["outcome"], e["user"].get("id")) for e in entries] == [
        ("success", "admin"),
        ("failure", None),
    ]
    failed = entries[1]
    assert failed["event"]["reason"] == "unauthorized"
    assert failed["source"]["ip"] == "127.0.0.1"
    # Sign-ins belong to no organization: the deployment's admins read them (org `~`).
    assert await search(client, ADMIN, org_id="~", action="auth.sign_in") == entries
    assert BOOTSTRAP_KEY not in await stored_text(raw_redis)


async def test_who_may_search(client: Client, org: dict[str, dict[str, str]]) -> None:
    answers = {
        who: await status(client, "GET", SEARCH, org[who])
        for who in ("olivia", "ada", "bob", "aud", "sam")
    }
    assert answers == {"olivia": 200, "ada": 200, "bob": 403, "aud": 200, "sam": 200}
    # Their own organization only: another one is not found, however it is asked.
    assert await status(client, "GET", SEARCH, org["aud"], params={"org_id": "sales"}) == 404
    in_sales = org["aud"] | {"X-Org-Id": "sales"}
    assert await status(client, "GET", SEARCH, in_sales) == 404
    assert await status(client, "GET", "/api/v1/audit-events/export", org["bob"]) == 403
    assert await status(client, "GET", SEARCH, {}) == 401

    eng = await search(client, org["aud"])
    assert eng
    assert {e["organization"]["id"] for e in eng} == {"eng"}
    sales = await search(client, org["sam"])
    assert {e["organization"]["id"] for e in sales} == {"sales"}
    # The deployment admin sees both, and what belongs to none.
    everything = await search(client, ADMIN)
    assert {(e["organization"] or {}).get("id") for e in everything} >= {"eng", "sales"}
    assert len(everything) > len(eng) + len(sales) - 1


async def test_filters_paging_and_export(
    client: Client, org: dict[str, dict[str, str]], raw_redis: aioredis.Redis
) -> None:
    ada = org["ada"]
    for user in ("u1", "u2", "u3"):
        await ok(client, "PUT", f"/api/organizations/eng/members/{user}", ada,
                 json={"role": "member"})  # fmt: skip
    middle = datetime.now(UTC)
    await asyncio.sleep(0.01)
    await ok(client, "DELETE", "/api/organizations/eng/members/u2", ada)

    by_ada = await search(client, org["olivia"], user_id="ada")
    assert by_ada
    assert {e["user"]["id"] for e in by_ada} == {"ada"}
    removals = await search(client, org["olivia"], action="member.remove")
    assert [e["acs"]["targets"]["user_id"] for e in removals] == ["u2"]
    on_u2 = await search(client, org["olivia"], target="u2")
    assert [e["event"]["action"] for e in on_u2] == ["member.remove", "member.set"]
    before = await search(client, org["olivia"], target="u2", until=middle.isoformat())
    assert [e["event"]["action"] for e in before] == ["member.set"]
    after = await search(client, org["olivia"], target="u2", since=middle.isoformat())
    assert [e["event"]["action"] for e in after] == ["member.remove"]
    combined = await search(client, org["olivia"], user_id="ada", action="member.set")
    assert {e["acs"]["targets"]["user_id"] for e in combined} == {"u1", "u2", "u3"}

    # Pages of 2 cover the whole log once, in order.
    whole = await search(client, org["olivia"])
    paged = await search(client, org["olivia"], limit="2")
    assert [e["event"]["id"] for e in paged] == [e["event"]["id"] for e in whole]
    assert len(whole) > 4

    async with client.get("/api/v1/audit-events/export", headers=org["aud"]) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        lines = (await resp.text()).splitlines()
    assert [json.loads(line) for line in lines] == whole
    async with client.get(
        "/api/v1/audit-events/export", headers=org["aud"], params={"action": "member.remove"}
    ) as resp:
        assert [json.loads(line) for line in (await resp.text()).splitlines()] == removals

    bad = await status(client, "GET", SEARCH, ada, params={"page_id": "not-a-cursor"})
    assert bad == 422


async def test_no_secret_is_ever_in_the_log(
    client: Client, org: dict[str, dict[str, str]], raw_redis: aioredis.Redis
) -> None:
    bob = org["bob"]
    used = [BOOTSTRAP_KEY, LLM_KEY, SECRET_VALUE, PROVIDER_TOKEN]
    used += [h["X-Session-API-Key"] for h in org.values()]
    made = await ok(client, "POST", "/api/v1/keys", bob, json={"name": "ci"})
    used.append(made["key"])
    await ok(client, "POST", "/api/v1/settings", bob, json={"llm_api_key": LLM_KEY})
    await ok(client, "POST", "/api/secrets", bob,
             json={"name": "DB_PASSWORD", "value": SECRET_VALUE})  # fmt: skip
    await ok(client, "POST", "/api/add-git-providers", bob,
             json={"provider_tokens": {"github": {"token": PROVIDER_TOKEN}}})  # fmt: skip
    # A client putting a key where the log keeps text: its user agent, its request id.
    sneaky = bob | {"User-Agent": f"curl {made['key']}", "X-Request-ID": made["key"][:60]}
    async with client.post("/api/v1/keys", headers=sneaky, json={"name": "two"}) as resp:
        used.append((await resp.json())["key"])
    origin = {"Origin": str(client.make_url("")).rstrip("/")}
    async with client.post("/auth/sign-in", headers=origin, json={"api_key": made["key"]}) as resp:
        assert resp.status == 200
        used.append(resp.cookies["acs_session"].value)
    async with client.post("/auth/sign-in", headers=origin, json={"api_key": LLM_KEY}) as resp:
        assert resp.status == 401

    entries = await search(client, ADMIN)
    actions = {e["event"]["action"] for e in entries}
    assert {"settings.update", "secret.create", "settings.providers_update", "key.create",
            "auth.sign_in"} <= actions  # fmt: skip
    (secret,) = [e for e in entries if e["event"]["action"] == "secret.create"]
    assert secret["user"]["id"] == "bob"
    (settings,) = [e for e in entries if e["event"]["action"] == "settings.update"]
    assert settings["acs"]["details"] == {"fields": "llm_api_key"}  # the name, not the value
    stored = await stored_text(raw_redis)
    exported = json.dumps(entries)
    for value in used:
        assert value not in stored
        assert value not in exported
        assert value[-24:] not in stored  # nor a recognisable part of it


async def test_a_user_agent_that_is_not_utf8_neither_fails_the_action_nor_its_entry(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    """A header's bytes that are not UTF-8 (aiohttp keeps them as lone surrogates) are stored
    as U+FFFD: the action and its entry are written, not refused with a 500."""
    made = await ApiKeyService(raw_redis, None).create("olga", admin=False)
    body = b'{"name": "ci"}'
    request = (
        b"POST /api/v1/keys HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        b"X-Session-API-Key: " + made.key.encode() + b"\r\nUser-Agent: caf\xe9 \xff/1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
    entries = [
        e
        for e in await search(client, ADMIN, user_id="olga")
        if e["event"]["action"] == "key.create"
    ]
    assert [e["user_agent"]["original"] for e in entries] == ["caf\ufffd \ufffd/1"]
