"""The step from one organization for all to organizations (issue 29): run at start, once per
deployment (recorded in `acs:migrations`), by one replica at a time, and safe to run again.

- the default organization (ACS_DEFAULT_ORGANIZATION) is made;
- every user of a stored API key, and every owner of a sandbox, becomes a member of it (the
  users of admin keys its owners); a user who already has memberships keeps them;
- every key is listed under its user (so its owner can list and revoke it).

Nothing a user owns changes: records keep their owner, and a record that names no organization
is the default organization's (sandboxes/models.py, conversations).
"""

from __future__ import annotations

import redis.asyncio as aioredis
import structlog

from controlplane.organizations.roles import Role
from controlplane.organizations.service import OrganizationService
from controlplane.store import keyspace, text
from controlplane.store.leader import LeaderLock

log = structlog.get_logger(__name__)

NAME = "organizations-v1"
LOCK_TTL = 120
BATCH = 500


async def migrate(redis: aioredis.Redis, organizations: OrganizationService) -> bool:
    """Apply the migration unless done. True when this call applied it."""
    await organizations.ensure_default()
    if await redis.sismember(keyspace.MIGRATIONS, NAME):
        return False
    # Owner-checked (a LeaderLock: only its own token extends or frees it): a replica whose
    # lock expired while it worked must not, finishing, free the lock another replica took.
    lock = LeaderLock(redis, keyspace.MIGRATIONS_LOCK, LOCK_TTL)
    if not await lock.hold():
        return False  # another replica is at it; its result is the same
    try:
        users = await _key_users(redis)
        owners = await _sandbox_owners(redis)
        for user in owners:
            users.setdefault(user, False)
        store = organizations.store
        for n, (user, admin) in enumerate(sorted(users.items())):
            if n % BATCH == 0 and not await lock.hold():
                # The lock expired and another replica has it: it does the same (idempotent).
                log.warning("migration_lock_lost", name=NAME, done=n, users=len(users))
                return False
            known = await redis.hexists(keyspace.user_orgs(user), "~known")
            if not known:
                role = Role.OWNER if admin else Role.MEMBER
                await store.set_role(organizations.default_org, user, role)
        await redis.sadd(keyspace.MIGRATIONS, NAME)
        log.info("migration_applied", name=NAME, users=len(users), sandboxes=len(owners))
        return True
    finally:
        await lock.release()


async def _key_users(redis: aioredis.Redis) -> dict[str, bool]:
    """User -> whether one of their keys is an admin key; each key indexed under its user."""
    users: dict[str, bool] = {}
    ids = [text(i) for i in await redis.zrange(keyspace.API_KEYS, 0, -1, withscores=False)]
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        async with redis.pipeline(transaction=False) as pipe:
            for key_id in chunk:
                pipe.hmget(keyspace.api_key(key_id), ["user_id", "is_admin", "created_at"])
            rows = await pipe.execute()
        scores = await redis.zmscore(keyspace.API_KEYS, chunk)
        async with redis.pipeline(transaction=False) as pipe:
            for key_id, (user, admin, _), score in zip(chunk, rows, scores, strict=True):
                if user is None:
                    continue
                name = text(user)
                users[name] = users.get(name, False) or text(admin or b"0") == "1"
                pipe.zadd(keyspace.user_api_keys(name), {key_id: score or 0})
            await pipe.execute()
    return users


async def _sandbox_owners(redis: aioredis.Redis) -> set[str]:
    """The owners of the sandboxes that name no organization (made before organizations)."""
    owners: set[str] = set()
    after = "+"
    while True:
        raw = await redis.zrange(
            keyspace.ALL_SANDBOXES, after, "-", desc=True, bylex=True, offset=0, num=BATCH
        )
        ids = [text(i) for i in raw]
        if not ids:
            return owners
        async with redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.hmget(keyspace.sandbox(sandbox_id), ["owner", "org"])
            rows = await pipe.execute()
        owners.update(text(owner) for owner, org in rows if owner is not None and not org)
        if len(ids) < BATCH:
            return owners
        after = f"({ids[-1]}"
