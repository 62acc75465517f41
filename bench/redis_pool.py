"""CPU a Redis command costs the control plane through its connection pool, beside redis-py's own.

Run: `.venv/bin/python -m bench.redis_pool [--commands 20000] [--rounds 5]`. bench/README.md says
what it measures and how.

Against a private redis-server, one process, the pools interleaved round by round so the host's
load hits each alike: GETs sent by 1 task, and by 16 tasks at once, through redis-py's plain
`ConnectionPool` (never waits: fails past its limit; still a lock and records per command),
redis-py's `BlockingConnectionPool` (what the control plane used before: waits, with a lock, a
time-out and observability records for every command) and the control plane's `BoundedPool`
(waits only when the pool is exhausted). Prints the median process CPU per command and each
pool's ratio to redis-py's BlockingConnectionPool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool, ConnectionPool

from controlplane.store.pool import BoundedPool
from tests.support.redis_server import RedisServer

POOL_SIZE = 50
POOLS: dict[str, Callable[[str], ConnectionPool]] = {
    "redis-py ConnectionPool (no wait)": lambda url: ConnectionPool.from_url(
        url, max_connections=POOL_SIZE
    ),
    "redis-py BlockingConnectionPool": lambda url: BlockingConnectionPool.from_url(
        url, max_connections=POOL_SIZE, timeout=5
    ),
    "ours: BoundedPool": lambda url: BoundedPool.from_url(
        url, max_connections=POOL_SIZE, timeout=5
    ),
}


async def cpu_per_command(
    url: str, make: Callable[[str], ConnectionPool], n: int, tasks: int
) -> float:
    """Process CPU microseconds per GET, `n` GETs spread over `tasks` concurrent tasks."""
    client = aioredis.Redis(connection_pool=make(url))
    try:
        await client.set("bench:pool", "v")
        await asyncio.gather(*(client.get("bench:pool") for _ in range(tasks)))  # connect

        async def worker(count: int) -> None:
            for _ in range(count):
                await client.get("bench:pool")

        began = time.process_time()
        await asyncio.gather(*(worker(n // tasks) for _ in range(tasks)))
        return (time.process_time() - began) / (n // tasks * tasks) * 1e6
    finally:
        await client.aclose()


async def measure(url: str, commands: int, rounds: int) -> list[str]:
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for tasks in (1, 16):
            for name, make in POOLS.items():
                cost = await cpu_per_command(url, make, commands, tasks)
                samples.setdefault((name, tasks), []).append(cost)
    lines = [f"{'pool':<34} {'tasks':>5} {'CPU us/GET':>11} {'x blocking':>10}"]
    for tasks in (1, 16):
        floor = statistics.median(samples[("redis-py BlockingConnectionPool", tasks)])
        for name in POOLS:
            cost = statistics.median(samples[(name, tasks)])
            lines.append(f"{name:<34} {tasks:>5} {cost:>11.1f} {cost / floor:>9.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="acs-bench-pool-") as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            lines = asyncio.run(measure(server.url, opts.commands, opts.rounds))
        finally:
            server.stop()
    print("\n".join(lines))
    print(f"load avg at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
