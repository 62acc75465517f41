"""Anonymous failures cannot grow the audit log without bound: failed sign-ins flooded by
unauthenticated clients from many addresses (Linux routes all of 127.0.0.0/8 to loopback, so
each client below has a source address of its own) leave at most the per-source and per-window
numbers of entries, and one summary entry a window counts every one left out."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from controlplane.store import keyspace, text
from controlplane.store.audit_flood import DROPPED_ACTION, source_of
from tests.support.types import ClientFactory

PER_SOURCE, PER_WINDOW, WINDOW = 3, 8, 2.0
FLOODER = "127.0.0.2"
CROWD = [f"127.0.0.{n}" for n in range(10, 22)]  # 12 sources, each under its own cap
BAD_KEY = "acs_000000000000_" + "x" * 43


def test_a_source_is_an_ipv6_64_or_an_ipv4_address() -> None:
    assert source_of("2001:db8:1:2::1") == source_of("2001:db8:1:2:ffff:ffff:ffff:fffe")
    assert source_of("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_of("192.0.2.7") != source_of("192.0.2.8")
    assert source_of("fe80::1%eth0") == "fe80::/64"
    assert source_of(None) == source_of("not an address") == "unknown"


async def _fail_sign_ins(url: str, source: str, count: int) -> None:
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(count):
            async with http.post(
                url + "/auth/sign-in", json={"api_key": BAD_KEY}, headers={"Origin": url}
            ) as resp:
                assert resp.status == 401, await resp.text()


async def _entries(redis: aioredis.Redis) -> list[dict[str, str]]:
    rows: Any = await redis.xrange(keyspace.AUDIT)
    return [{text(k): text(v) for k, v in fields.items()} for _, fields in rows]


def _window(time_ms: float) -> int:
    return int(time_ms // (WINDOW * 1000))


async def test_a_flood_of_failed_sign_ins_leaves_a_bounded_log(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(
        audit_anonymous_per_source=PER_SOURCE,
        audit_anonymous_per_window=PER_WINDOW,
        audit_anonymous_window=WINDOW,
        auth_rate_limit_per_minute=10_000,
        unauthenticated_rate=10_000,
    )
    url = str(client.make_url("")).rstrip("/")
    # Start at a window's beginning, so that the flood fits in one or two windows.
    await asyncio.sleep(WINDOW - time.time() % WINDOW)
    started = time.time() * 1000
    flood = 40
    await asyncio.gather(
        _fail_sign_ins(url, FLOODER, flood), *(_fail_sign_ins(url, s, 2) for s in CROWD)
    )
    ended = time.time() * 1000
    sent = flood + 2 * len(CROWD)
    windows = _window(ended) - _window(started) + 1

    failures = [e for e in await _entries(raw_redis) if e["action"] == "auth.sign_in"]
    assert all(e["outcome"] == "failure" and not e["user"] for e in failures)
    assert 0 < len(failures) <= PER_WINDOW * windows
    from_flooder = [e for e in failures if e["ip"] == FLOODER]
    # At most its own share; none at all when the crowd's requests came first and filled the
    # window's global bound (seen in a loaded run), which is the bound working too.
    assert len(from_flooder) <= PER_SOURCE * windows

    # Each window that left entries out gets one summary when it is over, counting them all.
    deadline = time.monotonic() + WINDOW * 2 + 5

    async def summaries() -> list[dict[str, str]]:
        return [e for e in await _entries(raw_redis) if e["action"] == DROPPED_ACTION]

    while sum(int(json.loads(s["details"])["dropped"]) for s in await summaries()) < (
        sent - len(failures)
    ):
        assert time.monotonic() < deadline, await summaries()
        await asyncio.sleep(0.2)
    found = await summaries()
    assert 1 <= len(found) <= windows
    details = [json.loads(s["details"]) for s in found]
    assert sum(int(d["dropped"]) for d in details) == sent - len(failures)
    assert all(1 <= int(d["sources"]) <= 1 + len(CROWD) for d in details)
    assert all(s["outcome"] == "failure" and not s["org"] for s in found)
    assert not await raw_redis.zcard(keyspace.AUDIT_ANONYMOUS_PENDING)

    # A second flood later adds at most its bounds again: the log grows by windows, not requests.
    before = len(await _entries(raw_redis))
    started = time.time() * 1000
    await _fail_sign_ins(url, FLOODER, 30)
    windows = _window(time.time() * 1000) - _window(started) + 1
    added = [e for e in (await _entries(raw_redis))[before:] if e["action"] == "auth.sign_in"]
    assert 0 < len(added) <= PER_SOURCE * windows
