"""Organizations and memberships in Redis (key names in controlplane.store.keyspace).

A membership is written twice in one transaction: the organization's members hash (user -> role)
and the user's organizations hash (organization -> role), which a request reads with one HGETALL
to learn where its caller may act (with the `~current` organization in the same hash).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from controlplane.organizations.models import OrgLimits
from controlplane.organizations.roles import Role
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.streams import APPEND_ENTRY, StreamEntry, script_args, stored

CURRENT = "~current"
KNOWN = "~known"
_LIMIT_FIELDS = ("max_running_sandboxes", "max_sandboxes", "llm_monthly_budget")
_FLOAT_FIELDS = frozenset({"llm_monthly_budget"})
ORG_LLM_BUDGET = "org_llm_monthly_budget"
"""The organization's own budget in its hash (`llm_monthly_budget` there is each member's)."""
WARM_POOL_SHARE = "warm_pool_share"

# Create only once: an existing organization keeps its name, members and limits. The audit
# entry (KEYS[3..], ARGV[5..]) with the creation.
_CREATE = (
    APPEND_ENTRY
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'created_at', ARGV[2], 'created_by', ARGV[3])
redis.call('ZADD', KEYS[2], 0, ARGV[4])
append_entry(3, 5)
return 1
"""
)


def _organization(row: dict[Any, Any]) -> dict[str, Any] | None:
    """An organization's hash as OrganizationStore.get returns it; None for no row."""
    if not row:
        return None
    return {
        "name": text(row[b"name"]),
        "created_at": datetime.fromisoformat(text(row[b"created_at"])),
        "limits": _limits(row),
        "llm_monthly_budget": _float(row, ORG_LLM_BUDGET),
        "warm_pool_share": _float(row, WARM_POOL_SHARE),
    }


def _limits(row: dict[Any, Any]) -> OrgLimits:
    values = {
        f: (float if f in _FLOAT_FIELDS else int)(text(row[f.encode()]))
        for f in _LIMIT_FIELDS
        if row.get(f.encode())
    }
    return OrgLimits(**values)


def _float(row: dict[Any, Any], field: str) -> float | None:
    value = row.get(field.encode())
    return float(text(value)) if value else None


class OrganizationStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._create = redis.register_script(_CREATE)

    async def create(self, org_id: str, name: str, created_by: str) -> bool:
        """False when it exists already (nothing changed)."""
        entry = audit.entry(AuditAction.ORG_CREATE, org_id=org_id)
        streams, entry_args = script_args(entry)
        made = await self._create(
            keys=[keyspace.organization(org_id), keyspace.ORGANIZATIONS, *streams],
            args=[name, datetime.now(UTC).isoformat(), created_by, org_id, *entry_args],
        )
        if made:
            stored(entry)
        return bool(made)

    async def get(self, org_id: str) -> dict[str, Any] | None:
        """name, created_at, limits; None when there is no such organization."""
        return _organization(await self._redis.hgetall(keyspace.organization(org_id)))

    async def with_member_limits(
        self, org_id: str, user_id: str
    ) -> tuple[dict[str, Any] | None, OrgLimits]:
        """`get(org_id)` and `member_limits(org_id, user_id)` in one round trip (every create
        reads both)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keyspace.organization(org_id))
            pipe.hgetall(keyspace.org_member_limits(org_id, user_id))
            org, member = await pipe.execute()
        return _organization(org), _limits(member)

    async def exists(self, org_id: str) -> bool:
        return bool(await self._redis.exists(keyspace.organization(org_id)))

    async def rename(self, org_id: str, name: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keyspace.organization(org_id), "name", name)
            await _execute(pipe, audit.entry())

    async def set_limits(self, key: str, limits: OrgLimits) -> None:
        """Write the limits that are set, clear those that are None (in `key`'s hash)."""
        values = limits.model_dump()
        async with self._redis.pipeline(transaction=True) as pipe:
            for field in _LIMIT_FIELDS:
                if values[field] is None:
                    pipe.hdel(key, field)
                else:
                    pipe.hset(key, field, str(values[field]))
            await _execute(pipe, audit.entry())

    async def set_values(self, org_id: str, values: dict[str, float | None]) -> None:
        """Set the organization's own values (ORG_LLM_BUDGET, WARM_POOL_SHARE); None removes."""
        key = keyspace.organization(org_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            for field, value in values.items():
                if value is None:
                    pipe.hdel(key, field)
                else:
                    pipe.hset(key, field, repr(float(value)))
            await _execute(pipe, audit.entry())

    async def member_limits(self, org_id: str, user_id: str) -> OrgLimits:
        return _limits(await self._redis.hgetall(keyspace.org_member_limits(org_id, user_id)))

    async def members_limits(self, org_id: str, user_ids: list[str]) -> list[OrgLimits]:
        """`member_limits` of each of `user_ids`, in order, in one round trip (a page of
        members read them one round trip each: a list of every member made as many)."""
        if not user_ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for user_id in user_ids:
                pipe.hgetall(keyspace.org_member_limits(org_id, user_id))
            rows = await pipe.execute()
        return [_limits(row) for row in rows]

    async def all_ids(self) -> list[str]:
        return [text(i) for i in await self._redis.zrange(keyspace.ORGANIZATIONS, 0, -1)]

    async def ids_after(self, after: str | None, count: int) -> list[str]:
        """Up to `count` organization ids after `after`, in id order (the index is lexical)."""
        start = f"({after}" if after else "-"
        raw = await self._redis.zrange(
            keyspace.ORGANIZATIONS, start, "+", bylex=True, offset=0, num=count
        )
        return [text(i) for i in raw]

    async def memberships(self, user_id: str) -> dict[str, str]:
        """The user's hash: organization -> role, plus `~current` and `~known` when set."""
        row = await self._redis.hgetall(keyspace.user_orgs(user_id))
        return {text(k): text(v) for k, v in row.items()}

    async def members(self, org_id: str) -> dict[str, Role]:
        row = await self._redis.hgetall(keyspace.org_members(org_id))
        return {text(k): Role(text(v)) for k, v in row.items()}

    async def set_role(self, org_id: str, user_id: str, role: Role) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keyspace.org_members(org_id), user_id, role.value)
            pipe.hset(keyspace.user_orgs(user_id), mapping={org_id: role.value, KNOWN: "1"})
            await _execute(pipe, _member_entry(AuditAction.MEMBER_SET, org_id, user_id, role))

    async def remove(self, org_id: str, user_id: str) -> bool:
        """False when the user was no member."""
        entry = _member_entry(AuditAction.MEMBER_REMOVE, org_id, user_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keyspace.org_members(org_id), user_id)
            pipe.hdel(keyspace.user_orgs(user_id), org_id)
            pipe.hset(keyspace.user_orgs(user_id), KNOWN, "1")
            pipe.delete(keyspace.org_member_limits(org_id, user_id))
            if entry is not None:
                entry.queue(pipe)
            removed, *_ = await pipe.execute()
        stored(entry)
        return bool(removed)

    async def apply_roles(self, user_id: str, managed: set[str], roles: dict[str, Role]) -> None:
        """The user's roles in the `managed` organizations become `roles` (absent: removed),
        in one transaction; organizations outside `managed` are left as they are."""
        current = await self.memberships(user_id)
        entries: list[StreamEntry | None] = []
        async with self._redis.pipeline(transaction=True) as pipe:
            for org_id in sorted(managed):
                role = roles.get(org_id)
                if role is None and org_id in current:
                    pipe.hdel(keyspace.org_members(org_id), user_id)
                    pipe.hdel(keyspace.user_orgs(user_id), org_id)
                    entries.append(_member_entry(AuditAction.MEMBER_REMOVE, org_id, user_id))
                elif role is not None and current.get(org_id) != role.value:
                    pipe.hset(keyspace.org_members(org_id), user_id, role.value)
                    pipe.hset(keyspace.user_orgs(user_id), org_id, role.value)
                    previous = current.get(org_id)
                    entries.append(
                        _member_entry(AuditAction.MEMBER_SET, org_id, user_id, role, previous)
                    )
            pipe.hset(keyspace.user_orgs(user_id), KNOWN, "1")
            for entry in entries:
                if entry is not None:
                    entry.queue(pipe)
            await pipe.execute()
        for entry in entries:
            stored(entry)

    async def set_current(self, user_id: str, org_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keyspace.user_orgs(user_id), CURRENT, org_id)
            await _execute(pipe, audit.entry())


def _member_entry(
    action: AuditAction,
    org_id: str,
    user_id: str,
    role: Role | None = None,
    previous: str | None = None,
) -> StreamEntry | None:
    details = {"role": role.value} if role is not None else {}
    if previous:
        details["previous"] = previous
    return audit.entry(action, details=details, org_id=org_id, user_id=user_id)


async def _execute(pipe: Any, entry: StreamEntry | None) -> None:
    """Run a transaction with the audit entry of what it does."""
    if entry is not None:
        entry.queue(pipe)
    await pipe.execute()
    stored(entry)
