"""The events webhook in one Redis round trip (EventStore.ingest): the session key, the
per-sandbox rate, the conversation and the append checked and made together, with every answer
the separate checks gave: a wrong key 401 (before a bad body's 422), over the rate 429 (also
before a 422), a conversation that is not the sandbox's (or deleted) acknowledged and not kept,
an event id stored once; a deleted sandbox's key refused at its next post (nothing cached)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from controlplane import keys
from controlplane.conversations import indexes as conversation_indexes
from controlplane.conversations import task_index
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.crypto import hash_api_key
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace, text
from tests.support.records import NO_ENGINE, RecordedSandbox, event, sandbox_record
from tests.support.types import Client


async def stored_ids(raw_redis: aioredis.Redis, cid: str) -> list[str]:
    entries: Any = await raw_redis.xrange(keyspace.events(cid))
    return [json.loads(fields[b"e"])["id"] for _sid, fields in entries]


async def test_one_post_is_one_round_trip(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, _alice = recorded
    url = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    assert (await client.post(url, json=[event()], headers=key)).status == 200  # scripts loaded
    # The server's start-up migrations run in the background with scripts of their own: counted
    # here only after they are done.
    migrations = {conversation_indexes.NAME, task_index.NAME}
    for _ in range(200):
        done = await raw_redis.smembers(keyspace.MIGRATIONS)
        if migrations <= {text(name) for name in done}:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the start-up migrations did not finish: {done}")
    await raw_redis.config_resetstat()
    posted = [event(), event()]
    resp = await client.post(url, json=posted, headers=key)
    assert resp.status == 200, await resp.text()
    stats: Any = await raw_redis.info("commandstats")
    # One script call; its own reads (the key's sandbox, the record) are the only GETs: the
    # middleware's key lookup and the service's record read are not made besides.
    assert stats["cmdstat_evalsha"]["calls"] == 1, stats
    assert stats["cmdstat_get"]["calls"] == 2, stats
    assert (await stored_ids(raw_redis, cid))[-2:] == [e["id"] for e in posted]


async def test_wrong_keys_are_401_before_anything_else(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, _alice = recorded
    other = sandbox_record("alice", SandboxStatus.RUNNING)
    assert await SandboxStore(raw_redis, client.app[keys.SECRET_BOX]).create(other, 0, Limits())
    url = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    wrong = [
        {},
        {"X-Session-API-Key": ""},
        {"X-Session-API-Key": "not-the-key"},
        {"X-Session-API-Key": other.session_api_key},  # another sandbox's own key
        {"X-Session-API-Key": "k" * 300},  # longer than a key can be
    ]
    bodies: list[Any] = [[event()], event(), [{"kind": "MessageEvent"}], "not json"]
    for headers in wrong:
        for body in bodies:
            data = body if isinstance(body, str) else None
            resp = await client.post(url, json=None if data else body, data=data, headers=headers)
            assert resp.status == 401, (headers, body, await resp.text())
            assert (await resp.json())["detail"] == "invalid sandbox session key"
    # A body too large for the handler's own check: the middleware's, before the body.
    big = [event(text="x" * 1000) for _ in range(80)]
    resp = await client.post(url, json=big, headers={"X-Session-API-Key": "no"})
    assert resp.status == 401
    assert await stored_ids(raw_redis, cid) == []
    # The right key with a bad body: the 422.
    resp = await client.post(url, json=[{"kind": "MessageEvent"}], headers=key)
    assert resp.status == 422


async def test_the_rate_is_counted_in_the_same_round_trip(
    make_client: Callable[..., Awaitable[Client]], raw_redis: aioredis.Redis
) -> None:
    client = await make_client(
        with_sandboxes=True, docker_url=NO_ENGINE, webhook_rate_limit_per_minute=3
    )
    key = secrets.token_urlsafe(32)
    record = sandbox_record("alice", SandboxStatus.RUNNING, key)
    assert await SandboxStore(raw_redis, client.app[keys.SECRET_BOX]).create(record, 0, Limits())
    cid = secrets.token_hex(16)
    info = AppConversationInfo(id=cid, created_by_user_id="alice", sandbox_id=record.id)
    await ConversationStore(raw_redis).save(info)
    url = f"/api/v1/webhooks/{record.id}/events/{cid}"
    headers = {"X-Session-API-Key": key}
    # A bad body under the limit: 422, and it counts (as the middleware counted it).
    assert (await client.post(url, json=[{"kind": "x"}], headers=headers)).status == 422
    kept = [event(), event()]
    for one in kept:
        assert (await client.post(url, json=[one], headers=headers)).status == 200
    refused = await client.post(url, json=[event()], headers=headers)
    assert refused.status == 429, await refused.text()
    assert "3 webhook requests per minute" in (await refused.json())["detail"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Over the limit a bad body is a 429 too; a wrong key is still a 401, and not counted.
    assert (await client.post(url, json=[{"kind": "x"}], headers=headers)).status == 429
    wrong = {"X-Session-API-Key": "wrong"}
    assert (await client.post(url, json=[event()], headers=wrong)).status == 401
    assert await stored_ids(raw_redis, cid) == [e["id"] for e in kept]


async def test_other_conversations_are_acknowledged_and_not_kept_ids_stored_once(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, _alice = recorded
    # Another sandbox's conversation, one that never was, and (below) a deleted one.
    foreign = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=foreign, created_by_user_id="alice", sandbox_id="s-other")
    )
    for target in (foreign, secrets.token_hex(16)):
        url = f"/api/v1/webhooks/{sandbox}/events/{target}"
        assert (await client.post(url, json=[event()], headers=key)).status == 200
        assert not await raw_redis.exists(keyspace.events(target))
    url = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    batch = [event(), event()]
    for _ in range(2):  # a retried batch: each id once
        assert (await client.post(url, json=batch, headers=key)).status == 200
    dashed = f"{cid[:8]}-{cid[8:12]}-{cid[12:16]}-{cid[16:20]}-{cid[20:]}".upper()
    again = f"/api/v1/webhooks/{sandbox}/events/{dashed}"
    assert (await client.post(again, json=[*batch, event()], headers=key)).status == 200
    assert len(await stored_ids(raw_redis, cid)) == 3
    info = await ConversationStore(raw_redis).get(cid)
    assert info is not None
    await ConversationStore(raw_redis).delete(info)
    assert (await client.post(url, json=[event()], headers=key)).status == 200
    assert len(await stored_ids(raw_redis, cid)) == 3


async def test_a_deleted_sandboxs_key_fails_at_its_next_post(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, _alice = recorded
    url = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    assert (await client.post(url, json=[event()], headers=key)).status == 200
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    record = await store.get(sandbox)
    assert record is not None
    await store.delete(record)
    assert (await client.post(url, json=[event()], headers=key)).status == 401
    assert len(await stored_ids(raw_redis, cid)) == 1


async def test_the_sandbox_is_touched_in_the_same_round_trip(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, _alice = recorded
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    before = await store.get(sandbox)
    assert before is not None
    url = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    assert (await client.post(url, json=[event()], headers=key)).status == 200
    after = await store.get(sandbox)
    assert after is not None
    assert after.last_activity_at > before.last_activity_at


async def _head_within(client: Client, path: str, key: str, body: bytes, sent: int) -> bytes:
    """Send a post's head declaring `body` and only its first `sent` bytes; the answer's head
    if it comes within a second, else b"" (the server is waiting for the rest)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Session-API-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body[:sent])
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
    except TimeoutError:
        writer.write(body[sent:])
        return b""
    finally:
        writer.close()


async def test_a_wrong_key_is_refused_before_the_body(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """A key of a key's shape that is not the sandbox's costs one look-up, not the body's read
    and parse (64 KiB of events, at the rate of an unauthenticated flood): its 401 comes while
    the body is still on the way. The right key's post waits for its body, then takes the one
    round trip (test_one_post_is_one_round_trip) from its second post on."""
    client, sandbox, cid, key, _alice = recorded
    path = f"/api/v1/webhooks/{sandbox}/events/{cid}"
    body = json.dumps([event() for _ in range(100)]).encode()
    assert len(body) < 64 * 1024
    for wrong in (secrets.token_urlsafe(32), "x"):
        answer = await _head_within(client, path, wrong, body, 10)
        assert answer.startswith(b"HTTP/1.1 401"), answer
    good = key["X-Session-API-Key"]
    assert await _head_within(client, path, good, body, 10) == b""  # waits for the rest
    assert (await client.post(path, data=body, headers=key)).status == 200
    # Known good here now, and refused again once it is not (the script's own check).
    await raw_redis.delete(keyspace.sandbox_by_key(hash_api_key(good)))
    resp = await client.post(path, json=[event()], headers=key)
    assert resp.status == 401
    answer = await _head_within(client, path, good, body, 10)
    assert answer.startswith(b"HTTP/1.1 401"), answer  # forgotten: looked up before the body


async def test_an_id_naming_another_key_is_not_a_conversation(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """The path's conversation id goes into the script's keys as sent: one that names another
    of the conversation's keys (its checkpoints, a hash) is a conversation the sandbox does not
    have (acknowledged, nothing kept), not a 500 from the script."""
    client, sandbox, cid, key, _alice = recorded
    await raw_redis.hset(keyspace.checkpoints(cid), "c", "{}")
    big = [event(text="x" * 1000) for _ in range(80)]  # over 64 KiB: the middleware's checks
    for odd in (f"{cid}:checkpoints", f"{cid}:*", "*", ":"):
        for body in ([event()], big):
            resp = await client.post(
                f"/api/v1/webhooks/{sandbox}/events/{odd}", json=body, headers=key
            )
            assert resp.status == 200, (odd, await resp.text())
        assert await raw_redis.exists(keyspace.events(odd.lower())) == 0
    assert await stored_ids(raw_redis, cid) == []
