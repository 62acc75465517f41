"""The idle reaper reads the settings of a page's owners in one round trip (issue 30), and
takes from them the timeouts it read one owner at a time before. Records without containers
(the app's engine answers nothing): only the reads are under test."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane import keys
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.settings.models import SettingsUpdate
from tests.support.records import NO_ENGINE, sandbox_record
from tests.support.types import ClientFactory


async def test_a_sweep_reads_a_page_of_owners_settings_at_once(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE, reaper_interval=3600.0)
    settings = client.app[keys.SETTINGS]
    reaper = client.app[keys.REAPER]
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    owners = [f"owner{n}" for n in range(12)]
    for n, owner in enumerate(owners[:8]):  # the last four keep the defaults (nothing stored)
        await settings.update(owner, SettingsUpdate(sandbox_idle_timeout=600 + n))
    records = []
    for n in range(60):
        status = SandboxStatus.PAUSED if n % 5 == 4 else SandboxStatus.RUNNING
        record = sandbox_record(owners[n % len(owners)], status)
        assert await store.create(record, 0, Limits())
        records.append(record)

    await raw_redis.config_resetstat()
    paused, retired = await reaper.sweep()  # nothing idle yet: only reads
    assert (paused, retired) == ([], [])
    stats: Any = await raw_redis.info("commandstats")
    assert stats["cmdstat_mget"]["calls"] == 1  # every RUNNING sandbox's owner, one page
    # No owner read on its own (48 RUNNING sandboxes: 48 GETs before); the app's own
    # background work may GET a key meanwhile.
    assert stats.get("cmdstat_get", {"calls": 0})["calls"] <= 2

    # The timeouts from the batch are the ones read one owner at a time.
    read = await reaper._owners(records)
    assert set(read) == {r.owner for r in records if r.status == SandboxStatus.RUNNING}
    for record in records:
        if record.status == SandboxStatus.RUNNING:
            batched = await reaper.timeout_of(record, read[record.owner])
            assert batched == await reaper.timeout_of(record)
    assert await reaper.timeout_of(records[0], read[records[0].owner]) == 600
