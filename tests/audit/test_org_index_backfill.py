"""A deployment upgraded from before the per-organization audit indexes: entries written the
old way (the log and the deployment-wide indexes only, keys as the code before them wrote
them), then the new code starts. Its backfill (controlplane/store/audit_backfill.py) gives them
their organization's indexes, so an auditor's search finds them; it runs once however many
replicas start, resumes where an interrupted one stopped, keeps what is written meanwhile, and
doubles nothing when run again."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace, text
from controlplane.store.audit import AuditLog, new_id
from controlplane.store.audit_backfill import NAME, AuditBackfill, Backfilled
from controlplane.store.audit_event import AuditRecord
from controlplane.store.audit_index import AuditIndexer
from controlplane.store.streams import APPEND_SCRIPT, StreamAdd, StreamEntry, lex_member
from tests.conftest import BOOTSTRAP_KEY
from tests.support.cli import run_in_process
from tests.support.types import Client, ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
SEARCH = "/api/v1/audit-events/search"
RETENTION = 86400.0


def old_adds(record: AuditRecord, retention: float = RETENTION) -> StreamEntry:
    """How AuditLog.adds stored an entry before the per-organization user and target indexes
    (git show dcdf6a4^:controlplane/store/audit.py), its keys spelled as that keyspace did:
    the log, the organization's stream, its per-action one, the action's, the user's, and a
    sorted set per target id."""
    retention_ms = int(retention * 1000)
    minid, ttl = record.time_ms - retention_ms, retention_ms
    org = record.org_id or "~"
    ref = ("r", "")

    def index(key: str) -> StreamAdd:
        return StreamAdd(key, ref, minid=minid, ttl_ms=ttl, same_id=True)

    adds = [
        StreamAdd("acs:audit", record.fields(), minid=minid),
        index(f"acs:audit:org:{org}"),
        index(f"acs:audit:org:{org}:action:{record.action}"),
        index(f"acs:audit:action:{record.action}"),
    ]
    if record.user_id:
        adds.append(index(f"acs:audit:user:{record.user_id}"))
    targets = {v for k, v in record.targets.items() if k.endswith("_id") and k != "org_id" and v}
    for target in sorted(targets):
        adds.append(
            StreamAdd(
                f"acs:audit:target:{target}",
                (),
                minid=minid,
                ttl_ms=ttl,
                same_id=True,
                lex_index=True,
            )
        )
    return StreamEntry((tuple(adds),))


def record(n: int, user: str | None, org: str | None, **targets: str) -> AuditRecord:
    now_ms = int(time.time() * 1000) - 3_600_000 + n  # an hour ago, one entry a millisecond
    return AuditRecord(
        id=new_id(now_ms),
        time_ms=now_ms,
        action="sandbox.create" if "sandbox_id" in targets else "member.set",
        outcome="success",
        user_id=user,
        key_id=None,
        via="api_key",
        admin=False,
        org_id=org,
        role="member",
        targets=targets,
    )


async def write_old(redis: aioredis.Redis, records: list[AuditRecord]) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for made in records:
            old_adds(made).queue(pipe)
        await pipe.execute()


async def write_new(redis: aioredis.Redis, made: AuditRecord) -> None:
    """An entry as the new code writes it (a replica already upgraded), and indexed by that
    replica's indexer (which had indexed everything before it: its watermark)."""
    entry = StreamEntry((AuditLog(redis, retention=RETENTION).adds(made),))
    keys, args = entry.script_args()
    await redis.eval(APPEND_SCRIPT, len(keys), *keys, *args)
    newest: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
    indexer = AuditIndexer(redis, retention=RETENTION)
    assert await indexer.apply((await indexer.watermark()) or "", [(text(newest[0][0]), made)])


async def expected(
    redis: aioredis.Redis, records: list[AuditRecord]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The per-organization user and target indexes `records` (in the log's order) call for:
    index -> stream ids, oldest first."""
    rows: Any = await redis.xrange(keyspace.AUDIT)
    ids = {text(fields[b"id"]): text(stream_id) for stream_id, fields in rows}
    users: dict[str, list[str]] = defaultdict(list)
    targets: dict[str, list[str]] = defaultdict(list)
    for made in sorted(records, key=lambda r: lex_member(ids[r.id])):
        org = made.org_id or keyspace.AUDIT_NO_ORG
        if made.user_id:
            users[keyspace.audit_org_user(org, made.user_id)].append(ids[made.id])
        for target in {v for k, v in made.targets.items() if k != "org_id"}:
            targets[keyspace.audit_org_target(org, target)].append(ids[made.id])
    return users, targets


async def assert_indexes(
    redis: aioredis.Redis, users: dict[str, list[str]], targets: dict[str, list[str]]
) -> None:
    """Each per-organization index holds exactly its entries, once each, in order."""
    for key, ids in users.items():
        rows: Any = await redis.xrange(key)
        assert [text(i) for i, _ in rows] == ids, key
        assert await redis.pttl(key) > 0, key
    for key, ids in targets.items():
        members = [text(m) for m in await redis.zrange(key, 0, -1)]
        assert members == [lex_member(i) for i in ids], key
        assert await redis.pttl(key) > 0, key
    found = {text(k) async for k in redis.scan_iter(match="acs:audit:org:*:user:*")}
    found |= {text(k) async for k in redis.scan_iter(match="acs:audit:org:*:target:*")}
    assert found == set(users) | set(targets)


async def per_org_indexes(redis: aioredis.Redis) -> dict[str, list[str]]:
    """Every per-organization user and target index, with what it holds."""
    held: dict[str, list[str]] = {}
    async for raw in redis.scan_iter(match="acs:audit:org:*"):
        key = text(raw)
        if ":user:" in key:
            rows: Any = await redis.xrange(key)
            held[key] = [text(i) for i, _ in rows]
        elif ":target:" in key:
            held[key] = [text(m) for m in await redis.zrange(key, 0, -1)]
    return held


async def search(client: Client, who: dict[str, str], **params: str) -> list[str]:
    async with client.get(SEARCH, headers=who, params=params | {"limit": "100"}) as resp:
        page = await resp.json()
        assert resp.status == 200, page
    assert page["next_page_id"] is None
    return [e["event"]["id"] for e in page["items"]]


async def test_an_upgraded_deployment_finds_its_old_entries_in_an_organization_search(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    old = [
        record(0, "ann", "eng", user_id="ben"),
        record(1, "ben", "eng", sandbox_id="sb1"),
        record(2, "ann", "eng", sandbox_id="sb1"),
        record(3, "ann", "sales", sandbox_id="sb9"),  # ann acts in sales too
        record(4, "ann", None),  # a sign-in: no organization
        record(5, "x", "sales", user_id="ann"),
    ]
    await write_old(raw_redis, old)
    # One entry written by an upgraded replica before this one started: ann's eng index exists
    # and holds an id newer than every old one.
    latest = record(10, "ann", "eng", sandbox_id="sb1")
    await write_new(raw_redis, latest)
    every = [*old, latest]
    assert await raw_redis.xlen(keyspace.audit_org_user("eng", "ann")) == 1
    assert not await raw_redis.exists(keyspace.audit_org_user("eng", "ben"))

    client = await make_client(with_sandboxes=False)  # the backfill runs in the background
    deadline = time.monotonic() + 30
    while not await raw_redis.sismember(keyspace.MIGRATIONS, NAME):
        assert time.monotonic() < deadline, "the backfill did not finish"
        await asyncio.sleep(0.05)
    await assert_indexes(raw_redis, *await expected(raw_redis, every))

    for org, owner in (("eng", "olivia"), ("sales", "sam")):
        async with client.post(
            "/api/organizations", headers=ADMIN, json={"id": org, "name": org, "owner": owner}
        ) as resp:
            assert resp.status == 201
    async with client.put(
        "/api/organizations/eng/members/aud", headers=ADMIN, json={"role": "auditor"}
    ) as resp:
        assert resp.status == 200
    aud = {
        "X-Session-API-Key": (await ApiKeyService(raw_redis, None).create("aud", org_id="eng")).key
    }

    ids = [r.id for r in every]
    newest_first = {
        "ann": [ids[6], ids[2], ids[0]],
        "ben": [ids[1]],
        "sb1": [ids[6], ids[2], ids[1]],
    }
    found = {
        "ann": await search(client, aud, user_id="ann"),
        "ben": await search(client, aud, user_id="ben"),
        "sb1": await search(client, aud, target="sb1"),
    }
    assert found == newest_first
    # Nothing of sales's, nor of no organization, in eng's search; the admin's sees all.
    assert await search(client, aud, target="sb9") == []
    assert await search(client, ADMIN, user_id="ann") == [ids[6], ids[4], ids[3], ids[2], ids[0]]

    # Run again (a second start, then the command's run): nothing doubles, nothing is lost.
    await AuditIndexer(raw_redis, retention=RETENTION).catch_up()  # the calls' entries above
    before = await per_org_indexes(raw_redis)
    await make_client(with_sandboxes=False)
    done = await AuditBackfill(raw_redis, retention=RETENTION).run(again=True)
    assert done is not None
    # Every entry of the log, the ones the API calls above wrote too.
    assert done.entries >= len(every)
    assert done.user_entries >= len([r for r in every if r.user_id])
    assert await per_org_indexes(raw_redis) == before
    assert {
        "ann": await search(client, aud, user_id="ann"),
        "ben": await search(client, aud, user_id="ben"),
        "sb1": await search(client, aud, target="sb1"),
    } == newest_first


async def test_the_backfill_resumes_runs_once_and_keeps_what_is_written_meanwhile(
    raw_redis: aioredis.Redis,
) -> None:
    users = ["u0", "u1", "u2", "u3"]
    orgs: list[str | None] = ["eng", "sales", None]
    old = [
        record(n, users[n % 4], orgs[n % 3], sandbox_id=f"sb{n % 7}", user_id=users[(n + 1) % 4])
        for n in range(3000)
    ]
    await write_old(raw_redis, old)

    # A replica starts the backfill, a batch at a time, and loses its lock part way (paused
    # past its lock's expiry while another took it).
    first = AuditBackfill(raw_redis, retention=RETENTION, batch=1, lock_ttl=2)
    task = asyncio.create_task(first.run())
    deadline = time.monotonic() + 30
    while text(await raw_redis.hget(keyspace.AUDIT_BACKFILL, "at") or "0-0") == "0-0":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    # Meanwhile an upgraded replica writes, to an index being rebuilt and to a new one.
    live = [record(4000, "u1", "eng", sandbox_id="sb1"), record(4001, "new", "eng")]
    for made in live:
        await write_new(raw_redis, made)
    await raw_redis.set(keyspace.AUDIT_BACKFILL_LOCK, "another replica", px=60_000)
    assert await task is None  # it stops at its next batch
    at = text(await raw_redis.hget(keyspace.AUDIT_BACKFILL, "at") or "")
    assert at not in ("", "0-0")
    assert not await first.done()
    await raw_redis.delete(keyspace.AUDIT_BACKFILL_LOCK)  # that replica died: its lock expired

    # Three replicas start at once: one carries on from where the first stopped.
    replicas = [AuditBackfill(raw_redis, retention=RETENTION, batch=200, lock_ttl=2) for _ in "abc"]
    results = await asyncio.gather(*(r.run() for r in replicas))
    worked = [r for r in results if isinstance(r, Backfilled) and not r.skipped]
    assert len(worked) == 1, results
    assert 0 < worked[0].entries < len(old)  # the rest only
    assert await raw_redis.sismember(keyspace.MIGRATIONS, NAME)
    assert not await raw_redis.exists(keyspace.AUDIT_BACKFILL, keyspace.AUDIT_BACKFILL_STAGED)
    wanted = await expected(raw_redis, [*old, *live])
    await assert_indexes(raw_redis, *wanted)

    # Done: a later start does nothing; run again on purpose, it changes nothing.
    assert (await replicas[0].run()) == Backfilled(skipped=True)
    again = await replicas[1].run(again=True)
    assert again is not None
    assert again.entries == len(old) + len(live)
    await assert_indexes(raw_redis, *wanted)


async def test_the_command_runs_it_again_on_demand(
    redis_url: str, raw_redis: aioredis.Redis, tmp_path: Path
) -> None:
    """`controlplane audit backfill`, as after a rolling upgrade: entries an older replica
    wrote after the backfill was done get their indexes; a second run changes nothing."""
    await raw_redis.sadd(keyspace.MIGRATIONS, NAME)  # done, before these were written
    old = [record(0, "ann", "eng", sandbox_id="sb1"), record(1, "ben", None, user_id="ann")]
    await write_old(raw_redis, old)
    wanted = await expected(raw_redis, old)
    env = {"ACS_REDIS_URL": redis_url, "ACS_DATA_DIR": str(tmp_path / "data")}
    for _ in range(2):
        result = await run_in_process("audit", "backfill", env=env)
        assert result.code == 0, result.err
        assert result.out.strip() == (
            "read 2 audit entries: 2 in 2 per-organization user indexes, "
            "2 in per-organization target indexes"
        )
        await assert_indexes(raw_redis, *wanted)
