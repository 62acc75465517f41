"""Writing the audit entry is part of the action: `controlplane serve` killed with SIGKILL while
clients make and revoke API keys and change members' roles, three times over. After each kill,
what Redis holds and what the audit log says agree both ways: every key that exists has its
`key.create` entry, every key that was made and is gone has its `key.revoke`, no entry names a
change that did not happen, and each member's role is the one their last `member.set` entry
names."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.store import keyspace, text
from controlplane.store.audit_event import AuditRecord
from tests.conftest import BOOTSTRAP_KEY
from tests.support.live_server import free_port
from tests.support.serve_process import launch_serve, serve_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
ROUNDS = 3
CLIENTS = 4
SEED = 20261128
ROLES = ("member", "admin", "auditor")
USERS = ("u0", "u1", "u2", "u3", "u4")


async def _client(http: aiohttp.ClientSession, url: str, rng: random.Random) -> None:
    """Keys made and revoked, roles changed, until the server dies under it."""
    mine: list[str] = []
    while True:
        op = rng.choice(["create", "create", "revoke", "role"])
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            if op == "create" or (op == "revoke" and not mine):
                async with http.post(f"{url}/api/v1/keys", headers=ADMIN, json={}) as resp:
                    if resp.status == 201:
                        mine.append((await resp.json())["key_id"])
            elif op == "revoke":
                key_id = mine.pop(rng.randrange(len(mine)))
                async with http.delete(f"{url}/api/v1/keys/{key_id}", headers=ADMIN) as resp:
                    await resp.read()
            else:
                user, role = rng.choice(USERS), rng.choice(ROLES)
                path = f"{url}/api/organizations/eng/members/{user}"
                async with http.put(path, headers=ADMIN, json={"role": role}) as resp:
                    await resp.read()


async def _records(redis: aioredis.Redis) -> list[AuditRecord]:
    rows: Any = await redis.xrange(keyspace.AUDIT)
    return [AuditRecord.from_fields({text(k): text(v) for k, v in f.items()}) for _, f in rows]


async def _disagreements(redis: aioredis.Redis) -> list[str]:
    records = [r for r in await _records(redis) if r.outcome == "success"]
    created = {r.targets["key_id"] for r in records if r.action == "key.create"}
    revoked = {r.targets["key_id"] for r in records if r.action == "key.revoke"}
    existing = {text(k) for k in await redis.zrange(keyspace.user_api_keys("admin"), 0, -1)}
    problems = []
    if existing - created:
        problems.append(f"keys without their key.create entry: {sorted(existing - created)}")
    if revoked & existing:
        problems.append(f"keys revoked in the log but still there: {sorted(revoked & existing)}")
    if created - existing - revoked:
        problems.append(f"keys made and gone without key.revoke: {created - existing - revoked}")
    roles = {
        text(k): text(v) for k, v in (await redis.hgetall(keyspace.org_members("eng"))).items()
    }
    last: dict[str, str] = {}
    for r in records:
        if r.action == "member.set" and r.targets.get("org_id") == "eng":
            last[r.targets["user_id"]] = r.details["role"]
    for user in USERS:
        if roles.get(user) != last.get(user):
            problems.append(f"{user}: role {roles.get(user)}, last entry {last.get(user)}")
    return problems


async def test_sigkill_between_action_and_entry_loses_neither(
    redis_url: str, raw_redis: aioredis.Redis, test_prefix: str, tmp_path: Path
) -> None:
    env = serve_env(redis_url, test_prefix, tmp_path / "data")
    rng = random.Random(SEED)
    port = free_port()
    async with aiohttp.ClientSession() as http:
        kills = 0
        for round_ in range(ROUNDS):
            server = await launch_serve(port, env)
            try:
                await server.wait_healthy(http)
                url = server.url
                if round_ == 0:
                    async with http.post(f"{url}/api/organizations", headers=ADMIN,
                                         json={"id": "eng", "name": "Eng",
                                               "owner": "olivia"}) as resp:  # fmt: skip
                        assert resp.status == 201, await resp.text()
                tasks = [
                    asyncio.create_task(_client(http, url, random.Random(rng.random())))
                    for _ in range(CLIENTS)
                ]
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                server.process.kill()  # SIGKILL: mid-request, mid-transaction if it can be
                kills += 1
                await server.process.wait()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                await server.kill()
            problems = await _disagreements(raw_redis)
            assert not problems, f"after kill {kills}: {problems}"
    records = await _records(raw_redis)
    assert sum(r.action == "key.create" for r in records) >= ROUNDS  # the clients did work
    assert any(r.action == "key.revoke" for r in records)
    assert any(r.action == "member.set" for r in records)
