"""Admission's memory sum without a walk: the reservations' total (keyspace.MEMORY_RESERVED_TOTAL)
changes with each reservation in the same script (sandboxes/store.py RESERVATIONS), so a create
reads one number instead of every sandbox's. Checked against the reservations themselves after
creates, pauses (a Docker pause holds, a Kubernetes one gives back), hibernation, deletes, a
warm pool member made and dropped; counted with Redis's own command statistics; and a total left
wrong by a writer that did not keep it is made again by the reconciler's sweep."""

from __future__ import annotations

import secrets
from collections import Counter

import docker
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.naming import POOL_OWNER
from controlplane.sandboxes.pool_store import PoolStore
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.support.docker_fixtures import run_prefix
from tests.support.records import sandbox_record
from tests.support.types import ClientFactory

S = SandboxStatus
MIB = 2**20


async def truth(redis: aioredis.Redis) -> int:
    return sum(int(v) for v in await redis.hvals(keyspace.MEMORY_RESERVED))


async def total(redis: aioredis.Redis) -> int:
    raw = await redis.get(keyspace.MEMORY_RESERVED_TOTAL)
    assert raw is not None
    return int(raw)


async def calls(redis: aioredis.Redis) -> Counter[str]:
    stats = await redis.info("commandstats")
    return Counter({name: int(row.get("calls", 0)) for name, row in stats.items()})


async def test_the_total_follows_every_reservation_and_admission_reads_only_it(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client()
    box = client.app[keys.SECRET_BOX]
    docker_like = SandboxStore(raw_redis, box)  # a pause keeps the memory
    kube_like = SandboxStore(raw_redis, box, paused_holds_memory=False)
    cap = Limits(memory_capacity=1000 * MIB)
    records = [sandbox_record(f"u{i}", S.RUNNING) for i in range(4)]
    for i, record in enumerate(records):
        assert await docker_like.create(record, (100 + i) * MIB, cap) == "ok"
    # Neither ERROR nor MISSING holds memory.
    assert await docker_like.create(sandbox_record("u9", S.ERROR), 50 * MIB, cap) == "ok"
    assert await total(raw_redis) == await truth(raw_redis) == 406 * MIB

    assert (await docker_like.transition(records[0], [S.RUNNING], S.PAUSED)).outcome == "ok"
    assert await total(raw_redis) == 406 * MIB  # frozen in place: still held
    assert await docker_like.hibernated(records[0].id, "idle")
    assert await total(raw_redis) == await truth(raw_redis) == 306 * MIB
    assert (await kube_like.transition(records[1], [S.RUNNING], S.PAUSED)).outcome == "ok"
    assert await total(raw_redis) == await truth(raw_redis) == 205 * MIB
    resumed = await kube_like.transition(records[1], [S.PAUSED], S.RUNNING, limits=cap)
    assert resumed.outcome == "ok"
    assert await total(raw_redis) == await truth(raw_redis) == 306 * MIB
    # The same reservation made again (a resume of what already holds) is not counted twice.
    again = await docker_like.transition(records[2], [S.RUNNING], S.RUNNING, limits=cap)
    assert again.outcome == "ok"
    assert await total(raw_redis) == await truth(raw_redis) == 306 * MIB
    await docker_like.delete(records[3])
    await docker_like.delete(records[3])  # twice, as a retried delete does: released once
    assert await total(raw_redis) == await truth(raw_redis) == 203 * MIB

    pool = PoolStore(raw_redis, docker_like)
    member = sandbox_record(POOL_OWNER, S.STARTING)
    assert await pool.create(member, "fp", 64 * MIB, 1000 * MIB)
    assert await total(raw_redis) == await truth(raw_redis) == 267 * MIB
    assert await pool.drop(member)
    assert await total(raw_redis) == await truth(raw_redis) == 203 * MIB

    # Admission refuses past the capacity, from the total alone: no walk of the reservations,
    # however many there are.
    for i in range(200):
        assert await docker_like.create(sandbox_record(f"v{i}", S.PAUSED), MIB, cap) == "ok"
    before = await calls(raw_redis)
    assert await docker_like.create(sandbox_record("w", S.RUNNING), 600 * MIB, cap) == "memory"
    assert await docker_like.create(sandbox_record("w", S.RUNNING), 500 * MIB, cap) == "ok"
    used = await calls(raw_redis) - before
    assert used["cmdstat_hvals"] == 0, used
    assert await total(raw_redis) == await truth(raw_redis) == 903 * MIB


async def test_a_missing_or_wrong_total_is_made_from_the_reservations(
    make_client: ClientFactory, raw_redis: aioredis.Redis, docker_client: docker.DockerClient
) -> None:
    """An upgrade finds reservations and no total: the first script that needs it makes it. A
    writer that did not keep it (an older replica, a hand edit) leaves it wrong: the next sweep
    makes it again."""
    prefix = f"{run_prefix()}reserve-{secrets.token_hex(3)}-"
    client = await make_client(with_sandboxes=True, container_prefix=prefix)
    # The sweeps are the test's own: the app's first (at its start) repaired the total in the
    # middle of the test on a loaded host (full run of 2026-11-29).
    await client.app[keys.RECONCILER].stop()
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    cap = Limits(memory_capacity=1000 * MIB)
    # As the version before the total left them.
    await raw_redis.hset(keyspace.MEMORY_RESERVED, mapping={"old1": 300 * MIB, "old2": 200 * MIB})
    await raw_redis.delete(keyspace.MEMORY_RESERVED_TOTAL)
    first = sandbox_record("a", S.RUNNING)
    assert await store.create(first, 600 * MIB, cap) == "memory"
    assert await store.create(first, 400 * MIB, cap) == "ok"
    assert await total(raw_redis) == await truth(raw_redis) == 900 * MIB
    await store.delete(first)  # (it has no container: the sweep below would mark it MISSING)

    # An older writer releases a reservation without the total: admission refuses what fits
    # until the sweep.
    await raw_redis.hdel(keyspace.MEMORY_RESERVED, "old1")
    assert await total(raw_redis) == 500 * MIB != await truth(raw_redis)
    assert await store.create(sandbox_record("b", S.RUNNING), 600 * MIB, cap) == "memory"
    await client.app[keys.RECONCILER].sweep()
    assert await total(raw_redis) == await truth(raw_redis) == 200 * MIB
    assert await store.create(sandbox_record("b", S.RUNNING), 600 * MIB, cap) == "ok"
