"""The Sentinel client's pool is bounded and waits (issue 30), on real redis-server and
redis-sentinel processes: redis-py's SentinelConnectionPool refuses past its size at once; ours
(store/pool.py: BoundedSentinelPool) makes a burst wait for the master's connections and says
`StoreBusy` only when a wait runs out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import load_config
from controlplane.store.failover import open_redis
from controlplane.store.pool import BoundedSentinelPool, StoreBusy
from tests.support.sentinel_cluster import MASTER_NAME, SentinelCluster

pytestmark = [pytest.mark.ha]


async def test_a_burst_waits_for_the_masters_connections(
    sentinel_cluster: SentinelCluster, tmp_path: Path
) -> None:
    client = await _client(sentinel_cluster, tmp_path, pool_timeout=0.3)
    pool = client.connection_pool
    assert isinstance(pool, BoundedSentinelPool)
    try:
        # Held: both connections block; a command that cannot wait long enough is busy.
        holds: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(client.blpop([f"hold:{n}"], timeout=1.0)) for n in range(2)
        ]
        for _ in range(500):
            if len(pool._in_use_connections) == 2:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(StoreBusy):
            await client.get("other")
        assert 0.3 <= time.monotonic() - started < 5.0  # an upper bound for a loaded host
        assert await asyncio.gather(*holds) == [None, None]
    finally:
        await client.aclose()

    # A burst of writes past the pool: each waits its turn (within a wait a loaded 2-core host
    # always meets), all of them land on the master, and the pool never grows past its size.
    client = await _client(sentinel_cluster, tmp_path, pool_timeout=30)
    pool = client.connection_pool
    assert isinstance(pool, BoundedSentinelPool)
    try:
        await asyncio.gather(*(client.incr("burst") for _ in range(200)))
        assert await client.get("burst") == b"200"
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 2
        master = pool.master_address
        assert master is not None
        assert master[1] == sentinel_cluster.master_port()
    finally:
        await client.aclose()


async def _client(cluster: SentinelCluster, tmp_path: Path, *, pool_timeout: float) -> Any:
    config = load_config(
        {},
        redis_sentinels=cluster.sentinel_addresses,
        redis_sentinel_master=MASTER_NAME,
        data_dir=tmp_path / "data",
        redis_max_connections=2,
        redis_pool_timeout=pool_timeout,
    )
    return await open_redis(config)
