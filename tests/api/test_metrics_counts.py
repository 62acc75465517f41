"""`acs_sandboxes` without a walk: the counts are sets per status in Redis, changed with each
status (sandboxes/store.py `count_by_status`). Checked against the records themselves (every
listed id's status, read the way the old walk did) after creates, pauses and deletes made on two
replicas, a warm pool claim, and a writer that did not know the sets (repaired by the sweep).
A scrape's cost is counted with Redis's own command statistics. `acs_conversations` the same way:
sets per execution status, changed with each write of a record (conversations/store.py
`count_by_execution_status`), built and put right at a replica's start."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable

import docker
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.metrics import NO_STATUS
from controlplane.sandboxes.admission import CapSources
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.naming import POOL_OWNER
from controlplane.sandboxes.pool_store import PoolStore
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace, text
from tests.api.test_metrics import scrape, value
from tests.support.docker_fixtures import run_prefix
from tests.support.records import sandbox_record
from tests.support.types import ClientFactory

S = SandboxStatus


async def truth(redis: aioredis.Redis) -> Counter[str]:
    """Every listed sandbox's status, from its record."""
    ids = [text(i) for i in await redis.zrange(keyspace.ALL_SANDBOXES, 0, -1)]
    statuses = [await redis.hget(keyspace.sandbox(i), "status") for i in ids]
    return Counter(text(s) for s in statuses if s is not None)


async def gauge(client: object, headers: dict[str, str]) -> Counter[str]:
    samples = await scrape(client, headers)  # type: ignore[arg-type]
    counts: Counter[str] = Counter()
    for status in S:
        n = int(value(samples, "acs_sandboxes", status=status.value))
        if n:
            counts[status.value] = n
    return counts


async def test_counts_follow_creates_pauses_and_deletes_on_two_replicas(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    one, two = await make_client(), await make_client()
    here = SandboxStore(raw_redis, one.app[keys.SECRET_BOX])
    there = SandboxStore(raw_redis, two.app[keys.SECRET_BOX])
    records = [sandbox_record(f"user{i % 3}", S.RUNNING) for i in range(6)]
    for record in records:
        assert await here.create(record, 0, Limits()) == "ok"
    starting = sandbox_record("user0", S.STARTING)
    assert await here.create(starting, 0, Limits()) == "ok"
    assert await gauge(one, admin_headers) == Counter({"RUNNING": 6, "STARTING": 1})

    # Another replica pauses two, starts one, loses one, deletes one; the first one's scrape
    # sees all of it.
    for record in records[:2]:
        assert (await there.transition(record, [S.RUNNING], S.PAUSED)).outcome == "ok"
    assert (await there.transition(starting, [S.STARTING], S.RUNNING)).outcome == "ok"
    assert (await there.transition(records[2], [S.RUNNING], S.MISSING)).outcome == "ok"
    await there.delete(records[3])
    # A refused compare-and-set changes nothing.
    assert (await there.transition(records[4], [S.PAUSED], S.RUNNING)).outcome == "conflict"
    expected = Counter({"RUNNING": 3, "PAUSED": 2, "MISSING": 1})
    assert await truth(raw_redis) == expected
    assert await gauge(one, admin_headers) == expected
    assert await gauge(two, admin_headers) == expected

    # A delete made from a stale copy of the record (it says RUNNING, Redis says PAUSED).
    await here.delete(records[0])
    expected = Counter({"RUNNING": 3, "PAUSED": 1, "MISSING": 1})
    assert await gauge(two, admin_headers) == expected == await truth(raw_redis)

    # A warm pool member is not counted until a user claims it; then it is, as RUNNING.
    pool = PoolStore(raw_redis, there)
    member = sandbox_record(POOL_OWNER, S.STARTING)
    assert await pool.create(member, "fp", 0, None)
    assert (await there.transition(member, [S.STARTING], S.RUNNING)).outcome == "ok"
    await pool.mark_ready(member.spec_id, member.id)
    assert await gauge(one, admin_headers) == expected
    no_caps = CapSources(
        keyspace.organization("o"), keyspace.org_member_limits("o", "user9"), -1, -1
    )
    claim = await pool.claim(member.spec_id, "fp", "user9", no_caps)
    assert claim.outcome == "ok"
    assert claim.sandbox_id == member.id
    expected = Counter({"RUNNING": 4, "PAUSED": 1, "MISSING": 1})
    assert await gauge(one, admin_headers) == expected == await truth(raw_redis)


async def cmdstats(redis: aioredis.Redis) -> Counter[str]:
    stats = await redis.info("commandstats")
    return Counter({name: int(row.get("calls", 0)) for name, row in stats.items()})


async def test_a_scrape_reads_no_sandbox_record(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    client = await make_client()
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    for i in range(300):
        assert await store.create(sandbox_record(f"u{i % 7}", S.PAUSED), 0, Limits()) == "ok"
    before = await cmdstats(raw_redis)
    assert (await gauge(client, admin_headers))["PAUSED"] == 300
    used = await cmdstats(raw_redis) - before
    # One SCARD a status set: the sandboxes' and the conversations' (None's among them).
    assert used["cmdstat_scard"] == len(S) + len(ExecutionStatus) + 1, used
    assert used["cmdstat_hget"] == 0, used  # no record read, whatever their number
    assert used["cmdstat_zrange"] <= 1, used  # the pool's members (none), not the sandboxes


async def test_the_sweep_repairs_what_a_writer_without_the_sets_left(
    make_client: ClientFactory,
    admin_headers: dict[str, str],
    raw_redis: aioredis.Redis,
    docker_client: docker.DockerClient,
) -> None:
    """An older replica (or a hand edit) changes a status, deletes a record and leaves an id
    behind without touching the sets; the reconciler's next sweep puts them right."""
    prefix = f"{run_prefix()}counts-{secrets.token_hex(3)}-"
    client = await make_client(with_sandboxes=True, container_prefix=prefix)
    reconciler = client.app[keys.RECONCILER]
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    # ERROR and MISSING: statuses the sweep leaves as they are (no container to compare with).
    records = [sandbox_record("alice", S.ERROR) for _ in range(3)]
    records += [sandbox_record("bob", S.MISSING) for _ in range(2)]
    for record in records:
        assert await store.create(record, 0, Limits()) == "ok"
    await reconciler.sweep()
    assert await gauge(client, admin_headers) == Counter({"ERROR": 3, "MISSING": 2})

    # The old writer: a status changed by hand, a record deleted without its set, and an id
    # missing from its set.
    await raw_redis.hset(keyspace.sandbox(records[0].id), "status", "MISSING")
    await raw_redis.delete(keyspace.sandbox(records[1].id))
    await raw_redis.zrem(keyspace.ALL_SANDBOXES, records[1].id)
    await raw_redis.srem(keyspace.sandboxes_in_status("MISSING"), records[3].id)
    await raw_redis.sadd(keyspace.sandboxes_in_status("RUNNING"), "gone" + secrets.token_hex(8))
    assert await gauge(client, admin_headers) != await truth(raw_redis)

    await reconciler.sweep()
    expected = Counter({"ERROR": 1, "MISSING": 3})
    assert await truth(raw_redis) == expected
    assert await gauge(client, admin_headers) == expected


def conversation(user: str, status: ExecutionStatus | None) -> AppConversationInfo:
    return AppConversationInfo(
        id=secrets.token_hex(16),
        created_by_user_id=user,
        sandbox_id=secrets.token_hex(8),
        execution_status=status,
    )


async def conversation_truth(redis: aioredis.Redis) -> Counter[str]:
    """Every conversation record's status, read the way the old walk did (SCAN, GET)."""
    counts: Counter[str] = Counter()
    prefix = keyspace.conversation("")
    async for key in redis.scan_iter(match=prefix + "*"):
        if ":" in text(key).removeprefix(prefix):
            continue
        raw = await redis.get(key)
        if raw is None:
            continue
        try:
            status = AppConversationInfo.model_validate_json(text(raw)).execution_status
        except ValueError:
            status = None  # what does not decode is counted without a status
        counts[status.value if status else NO_STATUS] += 1
    return counts


async def conversation_gauge(client: object, headers: dict[str, str]) -> Counter[str]:
    samples = await scrape(client, headers)  # type: ignore[arg-type]
    counts: Counter[str] = Counter()
    for label in [*(s.value for s in ExecutionStatus), NO_STATUS]:
        n = int(value(samples, "acs_conversations", execution_status=label))
        if n:
            counts[label] = n
    return counts


async def test_conversation_counts_follow_every_write_and_read_no_record(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    """Creates, status updates, saves and deletes on two replicas' stores; a delete from a stale
    copy; then a scrape's cost, counted by Redis."""
    one, two = await make_client(), await make_client()
    here, there = ConversationStore(raw_redis), ConversationStore(raw_redis)
    made = [conversation(f"user{i % 3}", None) for i in range(5)]
    for info in made:
        await here.create(info)
    saved = conversation("user1", ExecutionStatus.RUNNING)
    await there.save(saved)
    # A save overwrites whatever record has the id, its status set with it.
    await here.save(saved.model_copy(update={"execution_status": ExecutionStatus.FINISHED}))
    expected = Counter({NO_STATUS: 5, "finished": 1})
    assert await conversation_gauge(one, admin_headers) == expected

    def to(status: ExecutionStatus) -> Callable[[AppConversationInfo], None]:
        def change(info: AppConversationInfo) -> None:
            info.execution_status = status

        return change

    await there.update(made[0].id, to(ExecutionStatus.RUNNING))
    await there.update(made[1].id, to(ExecutionStatus.RUNNING))
    await here.update(made[1].id, to(ExecutionStatus.ERROR))
    await here.update(made[2].id, lambda info: None)  # a write that keeps the status
    await there.delete(made[3])
    stale = made[0].model_copy()  # says no status; Redis says RUNNING
    await here.delete(stale)
    expected = Counter({NO_STATUS: 2, "error": 1, "finished": 1})
    assert await conversation_truth(raw_redis) == expected
    assert await conversation_gauge(one, admin_headers) == expected
    assert await conversation_gauge(two, admin_headers) == expected

    for i in range(200):
        await here.save(conversation(f"u{i % 7}", ExecutionStatus.IDLE))
    before = await cmdstats(raw_redis)
    assert (await conversation_gauge(one, admin_headers))["idle"] == 200
    used = await cmdstats(raw_redis) - before
    assert used["cmdstat_scard"] == len(S) + len(ExecutionStatus) + 1, used
    assert used["cmdstat_get"] == used["cmdstat_mget"] == used["cmdstat_scan"] == 0, used


async def test_a_start_builds_the_conversation_sets_and_puts_right_what_they_missed(
    make_client: ClientFactory,
    admin_headers: dict[str, str],
    raw_redis: aioredis.Redis,
    docker_client: docker.DockerClient,
) -> None:
    """Records written by a version without the sets (or by hand), a status changed without
    them, a record deleted without them and a stray id: the next replica's start re-indexes."""
    store = ConversationStore(raw_redis)
    old = [conversation("alice", ExecutionStatus.RUNNING) for _ in range(3)]
    old += [conversation("bob", None) for _ in range(2)]
    for info in old:  # as the version before the sets wrote them
        await raw_redis.set(keyspace.conversation(info.id), info.model_dump_json())
    kept = conversation("carol", ExecutionStatus.FINISHED)
    await store.create(kept)
    changed = kept.model_copy(update={"execution_status": ExecutionStatus.STUCK})
    await raw_redis.set(keyspace.conversation(kept.id), changed.model_dump_json())
    await raw_redis.delete(keyspace.conversation(old[0].id))
    await raw_redis.sadd(keyspace.conversations_in_status("idle"), "gone" + secrets.token_hex(8))
    await raw_redis.set(keyspace.conversation(secrets.token_hex(16)), b"\xff not json")
    expected = Counter({"running": 2, NO_STATUS: 3, "stuck": 1})
    assert await conversation_truth(raw_redis) == expected

    # Its start (conversations come with sandboxes) re-indexes in the background.
    prefix = f"{run_prefix()}convsets-{secrets.token_hex(3)}-"
    client = await make_client(with_sandboxes=True, container_prefix=prefix)
    deadline = asyncio.get_running_loop().time() + 10
    while (found := await conversation_gauge(client, admin_headers)) != expected:
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.05)
    # Nothing left to put right: a second pass changes nothing.
    assert await store.reindex_statuses() == 0
