"""The warm pool with real Docker and Redis: refills, claims exactly once across replicas, never
shows a member to users, never recycles a claimed sandbox, drops stale members, stays within the
host's capacity."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from controlplane.crypto import SecretBox
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.pool import fingerprint
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from drivers.docker import names as docker_names
from drivers.docker.host_memory import HostMemory
from tests.conftest import BOOTSTRAP_KEY
from tests.support.sandbox_helpers import (
    REPO,
    OwnDocker,
    exec_as_agent,
    spec_dir,
    wait_status,
)
from tests.support.types import Client, ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
FAST = {"pool_interval": 0.2, "pool_refill_delay": 0.2, "reconcile_interval": 1.0}


async def pool_of(client: Client, spec: str = "default") -> dict[str, Any]:
    resp = await client.get("/api/v1/sandbox-pool", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    return next(s for s in body["specs"] if s["spec_id"] == spec)


async def wait_ready(
    client: Client, count: int, spec: str = "default", within: float = 60
) -> set[str]:
    """Poll the admin view until `count` members are ready; their ids."""
    deadline = time.monotonic() + within
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = await pool_of(client, spec)
        ready = {m["id"] for m in view["members"] if m["ready"] and not m["stale"]}
        if len(ready) >= count:
            return ready
        await asyncio.sleep(0.1)
    raise AssertionError(f"the pool of {spec} did not reach {count} ready: {view}")


async def create(client: Client, headers: dict[str, str]) -> dict[str, Any]:
    resp = await client.post("/api/v1/sandboxes", json={}, headers=headers)
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    return body


async def test_claims_hand_out_each_member_once_across_two_replicas(
    own_docker: OwnDocker,
    make_client: Any,
    user_headers: Any,
) -> None:
    settings = {"with_sandboxes": True, "container_prefix": own_docker.prefix, "warm_pool": "2"}
    one: Client = await make_client(**settings, **FAST)
    two: Client = await make_client(**settings, **FAST)
    members = await wait_ready(one, 2)
    users = [await user_headers(f"user{n}") for n in range(6)]

    # Unclaimed members are nobody's: not in any search, batch get or count, not even an
    # admin's all_users view; GET by id is a 404.
    alice = users[0]
    for headers, query in ((alice, ""), (ADMIN, "?all_users=true")):
        page = await (await one.get(f"/api/v1/sandboxes/search{query}", headers=headers)).json()
        assert not members & {s["id"] for s in page["items"]}
    ids = "&".join(f"id={m}" for m in members)
    for headers in (alice, ADMIN):
        assert await (await one.get(f"/api/v1/sandboxes?{ids}", headers=headers)).json() == [
            None,
            None,
        ]
        member = next(iter(members))
        assert (await one.get(f"/api/v1/sandboxes/{member}", headers=headers)).status == 404
    metrics = await (await one.get("/metrics", headers=ADMIN)).text()
    assert 'acs_pool_members{spec="default",status="ready"} 2.0' in metrics

    # Six creates at once, alternating replicas: each member goes to exactly one user.
    bodies = await asyncio.gather(
        *(create(one if n % 2 else two, headers) for n, headers in enumerate(users))
    )
    got = [b["id"] for b in bodies]
    assert len(set(got)) == len(got)
    assert members <= set(got), "the oldest ready members are claimed first"
    for body, headers in zip(bodies, users, strict=True):
        if body["id"] in members:
            assert body["status"] == "RUNNING"
            assert body["session_api_key"]
            # The key the user sees is the one the member's agent server accepts.
            url = body["exposed_urls"][0]["url"]
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{url}/api/info",
                    headers={"X-Session-API-Key": body["session_api_key"]},
                ) as resp,
            ):
                assert resp.status == 200
        mine = await (await one.get("/api/v1/sandboxes/search", headers=headers)).json()
        assert [s["id"] for s in mine["items"]] == [body["id"]]
        assert mine["items"][0]["created_by_user_id"] == body["created_by_user_id"]
    # Claims answer RUNNING at once, cold starts STARTING; the counter saw every claim.
    view = await pool_of(one)
    assert view["claims"] == sum(b["status"] == "RUNNING" for b in bodies) >= 2
    assert not members & {m["id"] for m in view["members"]}
    # Claimed sandboxes are the users' own, with labels that still say ~pool: the reconciler
    # keeps them (Redis says who owns them).
    labelled = {
        c.labels[docker_names.LABEL_ID]: c.labels[docker_names.LABEL_OWNER]
        for c in own_docker.containers()
    }
    assert {labelled.get(m) for m in members} == {naming.POOL_OWNER}

    # ...and the pool refills behind the claims.
    refilled = await wait_ready(two, 2)
    assert not refilled & set(got)


async def test_refill_waits_for_the_claims_to_pause_then_fills_the_pool(
    own_docker: OwnDocker,
    make_client: Any,
    user_headers: Any,
) -> None:
    """Claims on either replica hold the leader's refill (ACS_POOL_REFILL_DELAY): nothing boots
    while they keep coming, the pool is full again once they pause."""
    settings = {"with_sandboxes": True, "container_prefix": own_docker.prefix, "warm_pool": "3"}
    delay = 1.5
    one: Client = await make_client(**settings, pool_interval=0.2, pool_refill_delay=delay)
    two: Client = await make_client(**settings, pool_interval=0.2, pool_refill_delay=delay)
    first = await wait_ready(one, 3)
    users = [await user_headers(f"user{n}") for n in range(3)]

    async def members() -> set[str]:
        return {m["id"] for m in (await pool_of(one))["members"]}

    # Three claims 0.5 s apart, on both replicas (only one of them refills): each one's
    # replacement waits until `delay` after the last claim.
    claimed: list[str] = []
    for n, headers in enumerate(users):
        body = await create(one if n % 2 else two, headers)
        assert body["status"] == "RUNNING"
        claimed.append(body["id"])
        last = time.monotonic()
        while time.monotonic() < last + 0.5:
            assert await members() == first - set(claimed), "a member booted during the claims"
            await asyncio.sleep(0.05)
    assert set(claimed) == first
    while time.monotonic() < last + delay - 0.3:  # the hold's last moments: still none
        assert await members() == set()
        await asyncio.sleep(0.05)
    # ...then the pool refills to its size.
    refilled = await wait_ready(two, 3)
    assert not refilled & first
    assert len(await members()) == 3


async def test_claimed_member_keeps_nothing_of_another_user(
    own_docker: OwnDocker,
    make_sandbox_client: ClientFactory,
    user_headers: Any,
) -> None:
    client: Client = await make_sandbox_client(warm_pool="1", **FAST)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    first = next(iter(await wait_ready(client, 1)))
    mine = await create(client, alice)
    assert mine["id"] == first
    # Its lifecycle starts at the claim, in alice's stream; the pool's boot is nobody's event.
    url = "/api/v1/lifecycle-events/search"
    events = (await (await client.get(url, headers=alice)).json())["items"]
    assert sorted(e["type"] for e in events if e["sandbox_id"] == first) == [
        "sandbox.created",
        "sandbox.running",
    ]
    every = (await (await client.get(f"{url}?all_users=true", headers=ADMIN)).json())["items"]
    assert {e["user_id"] for e in every} == {"alice"}
    # Stored by the claim's script, in order, naming the member it picked (LATE_ID filled in).
    assert [(e["type"], e["sandbox_id"], e["automatic"]) for e in reversed(every)] == [
        ("sandbox.created", first, False),
        ("sandbox.running", first, False),
    ]
    assert len({e["id"] for e in every}) == 2
    # Its audit entry, written by the claim's script, names the member the claim picked.
    audit = f"/api/v1/audit-events/search?target={first}"
    entries = (await (await client.get(audit, headers=ADMIN)).json())["items"]
    assert [(e["event"]["action"], e["user"]["id"]) for e in entries] == [
        ("sandbox.create", "alice")
    ]
    assert entries[0]["acs"]["targets"] == {"sandbox_id": first}
    container = own_docker.container(first)
    code, _ = await asyncio.to_thread(
        container.exec_run, ["sh", "-c", "echo alice-secret > /workspace/alice.txt"], user="agent"
    )
    assert code == 0
    assert (await client.delete(f"/api/v1/sandboxes/{first}", headers=alice)).status == 200

    second = next(iter(await wait_ready(client, 1)))
    assert second != first, "a claimed sandbox never goes back to the pool"
    theirs = await create(client, bob)
    assert theirs["id"] == second
    other = own_docker.container(second)
    code, out = await asyncio.to_thread(exec_as_agent, other, "ls", "-A", "/workspace")
    assert code == 0
    assert "alice.txt" not in out
    # Alice's sandbox is gone with its workspace; nobody else sees hers or bob's.
    assert (await client.get(f"/api/v1/sandboxes/{second}", headers=alice)).status == 404
    assert docker_names.volume_name(own_docker.prefix, first) not in {
        v.name for v in own_docker.client.volumes.list(filters={"name": own_docker.prefix})
    }


PAUSED_POOL = """
id: pooled
description: a paused warm pool
image: {image}
command: ["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]
exposed_ports: {{AGENT_SERVER: 8000}}
resources: {{cpus: 0.5, memory: 256m, pids: 128}}
warm_pool: 1
warm_pool_state: paused
{extra}
"""


def paused_spec(tmp: Path, extra: str = "") -> Path:
    image = SpecCatalog.load(REPO / "specs").get(None).image
    directory = tmp / "specs"
    if not directory.exists():
        directory = spec_dir(tmp, {})
    (directory / "pooled.yaml").write_text(PAUSED_POOL.format(image=image, extra=extra))
    return directory


async def test_paused_member_is_unpaused_on_claim_and_stale_ones_are_replaced(
    own_docker: OwnDocker,
    make_client: Any,
    user_headers: Any,
    tmp_path: Path,
) -> None:
    specs = paused_spec(tmp_path)
    settings = {"with_sandboxes": True, "container_prefix": own_docker.prefix, "spec_dir": specs}
    old: Client = await make_client(**settings, warm_pool=None, **FAST)
    first = next(iter(await wait_ready(old, 1, "pooled")))
    name = docker_names.container_name(own_docker.prefix, first)
    assert own_docker.client.containers.get(name).status == "paused"
    await old.close()

    # The spec changes while no control plane runs: the next one drops the stale member.
    paused_spec(tmp_path, "idle_timeout: 600")
    new: Client = await make_client(**settings, warm_pool=None, **FAST)
    second = next(iter(await wait_ready(new, 1, "pooled")))
    assert second != first
    deadline = time.monotonic() + 30
    while name in {c.name for c in own_docker.containers()}:
        assert time.monotonic() < deadline, "the stale member's container was not removed"
        await asyncio.sleep(0.2)

    alice = await user_headers("alice")
    resp = await new.post("/api/v1/sandboxes", json={"sandbox_spec_id": "pooled"}, headers=alice)
    body = await resp.json()
    assert body["id"] == second
    assert body["status"] == "RUNNING"
    assert own_docker.container(second).status == ("running")
    await wait_status(new, alice, second, "RUNNING")
    # A paused member's events are published once it is unpaused (not by the claim's script).
    url = "/api/v1/lifecycle-events/search"
    events = (await (await new.get(url, headers=alice)).json())["items"]
    assert [(e["type"], e["sandbox_id"]) for e in reversed(events)] == [
        ("sandbox.created", second),
        ("sandbox.running", second),
    ]


def test_fingerprint_follows_spec_content_and_image() -> None:
    spec = SpecCatalog.load(REPO / "specs").get(None)
    changed = spec.model_copy(update={"description": "another"})
    assert fingerprint(spec, "sha256:a") == fingerprint(spec, "sha256:a")
    assert fingerprint(spec, "sha256:a") != fingerprint(spec, "sha256:b")
    assert fingerprint(spec, "sha256:a") != fingerprint(changed, "sha256:a")


async def test_pool_stays_within_capacity_and_refusals_come_before_the_engine(
    own_docker: OwnDocker,
    make_sandbox_client: ClientFactory,
    user_headers: Any,
    tmp_path: Path,
) -> None:
    mib = 1024**2
    specs = spec_dir(tmp_path, {})
    client: Client = await make_sandbox_client(
        spec_dir=specs,
        warm_pool="default=5",
        host_memory_bytes=3 * 64 * mib,  # room for three sandboxes of the default reservation
        **FAST,
    )
    members = await wait_ready(client, 3)
    await asyncio.sleep(1.0)  # a few more refill passes: still three
    assert len((await pool_of(client))["members"]) == 3
    assert len(own_docker.containers()) == 3

    alice = await user_headers("alice")
    claimed = await create(client, alice)  # the member's reservation passes to alice
    assert claimed["id"] in members
    await asyncio.sleep(1.0)
    assert len(own_docker.containers()) == 3, "no room for a fourth"
    assert len((await pool_of(client))["members"]) == 2

    # The pool is drained of ready members: the next creates claim the rest, then the host
    # guard refuses with 429 before any engine call that could fail.
    for _ in range(2):
        await create(client, alice)
    resp = await client.post("/api/v1/sandboxes", json={}, headers=alice)
    assert resp.status == 429
    assert "memory" in (await resp.json())["detail"]
    assert len(own_docker.containers()) == 3


async def test_default_reservation_admits_300_idle_sandboxes_on_24_gib(
    raw_redis: aioredis.Redis,
) -> None:
    """Admission counts reservations, not limits: the default spec (1 GiB limit) reserves
    64 MiB, so the default 0.9 of a 24 GiB host holds 345 of them, and refuses the next."""
    spec = SpecCatalog.load(REPO / "specs").get(None)
    assert spec.resources.memory_bytes == 1024**3
    store = SandboxStore(raw_redis, SecretBox(Fernet.generate_key()))
    limits = Limits(memory_capacity=int(24 * 1024**3 * 0.9))
    outcomes = []
    for n in range(346):
        now = datetime.now(UTC)
        record = SandboxRecord(
            id=naming.new_sandbox_id(),
            owner=f"user{n}",
            spec_id=spec.id,
            status=SandboxStatus.RUNNING,
            session_api_key=f"key-{n}",
            created_at=now,
            updated_at=now,
            last_activity_at=now,
        )
        outcomes.append(await store.create(record, spec.resources.reservation_bytes, limits))
    assert outcomes[:345] == ["ok"] * 345
    assert outcomes[345] == "memory"


async def test_host_short_of_memory_refuses_before_the_engine(
    own_docker: OwnDocker,
    make_sandbox_client: ClientFactory,
    user_headers: Any,
) -> None:
    """Reservations overcommit the limits: the live guard refuses (429, nothing created) while
    the host has less available than ACS_HOST_MEMORY_FLOOR, and the pool does not refill."""
    client: Client = await make_sandbox_client(
        warm_pool="1",
        host_memory_floor=1024**5,  # more than any host has
        **FAST,
    )
    alice = await user_headers("alice")
    resp = await client.post("/api/v1/sandboxes", json={}, headers=alice)
    assert resp.status == 429
    assert "memory" in (await resp.json())["detail"]
    await asyncio.sleep(1.0)  # several refill passes
    assert (await pool_of(client))["members"] == []
    assert own_docker.containers() == []


def test_host_memory_reads_meminfo_and_ignores_a_remote_engine(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemAvailable:    1048576 kB\n")  # 1 GiB
    local = HostMemory(512 * 1024**2, None, meminfo)
    assert local.available() == 1024**3
    assert local.room_for(256 * 1024**2)
    assert not local.room_for(768 * 1024**2)
    assert HostMemory(512 * 1024**2, "tcp://10.0.0.5:2375", meminfo).room_for(1024**3)
    assert HostMemory(0, None, meminfo).room_for(1024**3)
