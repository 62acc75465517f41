"""What calls cost, written to Redis in batches: the calls settled while a write is on its way go
together in the next one (controlplane/gateway/service.py, `_flush`; metering.py,
`record_many`), each record added as it would be alone; against a real Redis, through the real
gateway under concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.gateway.metering import (
    FIELDS,
    RECORD_BATCH,
    USER_USAGE_TTL,
    Meter,
    Record,
    Usage,
    month,
)
from controlplane.store import keyspace, text
from tests.gateway.conftest import LLM_KEY
from tests.gateway.test_over_http import PRICES, User, ask
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.live_server import start_live_server
from tests.support.log_capture import capture_logs


async def test_records_of_a_batch_are_added_as_each_alone(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    meter = Meter(redis)
    this_month = month()
    try:
        await meter.record_many(
            [
                Record("batch-u1", None, Usage(10, 5, 0.25)),
                Record("batch-u1", "batch-c1", Usage(1, 2, 0.5), org_id="batch-org"),
                Record("batch-u2", "batch-c1", Usage(3, 4, 0.125)),
            ]
        )
        await meter.record("batch-u1", None, Usage(100, 0, 1.0))  # one alone, the same script

        async def row(key: str) -> list[str]:
            return [text(v) if v is not None else "-" for v in await redis.hmget(key, FIELDS)]

        assert await row(keyspace.llm_usage_user("batch-u1", this_month)) == [
            "1.75",
            "111",
            "7",
            "3",
        ]
        assert await row(keyspace.llm_usage_user("batch-u2", this_month)) == [
            "0.125",
            "3",
            "4",
            "1",
        ]
        assert await row(keyspace.llm_usage_conversation("batch-c1")) == ["0.625", "4", "6", "2"]
        org = keyspace.llm_usage_org("batch-org", this_month)
        member = keyspace.llm_usage_member("batch-org", "batch-u1", this_month)
        assert await row(org) == ["0.5", "1", "2", "1"]
        assert await row(member) == ["0.5", "1", "2", "1"]
        for key in (keyspace.llm_usage_user("batch-u2", this_month), org, member):
            assert USER_USAGE_TTL - 60 < await redis.ttl(key) <= USER_USAGE_TTL
        assert await redis.ttl(keyspace.llm_usage_conversation("batch-c1")) == -1  # kept
    finally:
        await redis.aclose()


async def script_runs(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


async def test_concurrent_calls_are_all_metered_in_fewer_writes(
    make_config: Callable[..., ServiceConfig],
    redis_url: str,
    user_headers: Callable[..., Any],
    fake: FakeLLM,
) -> None:
    calls = 24
    server = await start_live_server(
        make_config(llm_prices=PRICES, sandbox_host_ports=[fake.port]), with_sandboxes=False
    )
    redis = aioredis.Redis.from_url(redis_url)
    fake.when_exhausted = reply_text("ok", usage=(100, 50))  # $0.2 a call
    try:
        async with aiohttp.ClientSession() as http:
            carol = User(http, server.url, (await user_headers("carol"))["X-Session-API-Key"])
            await carol.settings(
                llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY
            )
            key = await carol.gateway_key()
            await ask(server, key)  # the scripts loaded, the first record written
            status, before = await carol.call("GET", "/api/v1/llm-gateway/usage")
            assert status == 200, before
            runs = await script_runs(redis)
            # All in flight, then answered together: they settle within a few passes of the
            # loop, while the first of their writes is on its way.
            fake.hold()
            asked = asyncio.gather(*(ask(server, key) for _ in range(calls)))
            await fake.wait_for_requests(len(fake.requests) + calls)
            fake.release()
            await asked
            status, after = await carol.call("GET", "/api/v1/llm-gateway/usage")
            assert status == 200, after
            # Every call counted, at its price: none lost or counted twice in a batch.
            assert after["requests"] - before["requests"] == calls
            assert after["prompt_tokens"] - before["prompt_tokens"] == 100 * calls
            assert abs(after["cost"] - before["cost"] - 0.2 * calls) < 1e-9
            # One script a call reads its credential, budgets and rate count; the records took
            # fewer than one a call between them.
            assert await script_runs(redis) - runs < 2 * calls
    finally:
        await redis.aclose()
        await server.close()


async def test_a_batch_of_thousands_goes_in_scripts_of_a_bounded_size(redis_url: str) -> None:
    """Review finding: the records settled during a write go in the next one, thousands after
    a stall of Redis; one script for them all held Redis as long for every caller. They go
    RECORD_BATCH a script, every one added."""
    redis = aioredis.Redis.from_url(redis_url)
    meter = Meter(redis)
    this_month = month()
    many = 1_000
    try:
        await meter.record("many-u0", None, Usage(0, 0, 0.0))  # the script loaded
        before = await script_runs(redis)
        await meter.record_many(
            [
                Record(f"many-u{n % 7}", f"many-c{n % 3}", Usage(1, 2, 0.5), org_id="many-org")
                for n in range(many)
            ]
        )
        runs = await script_runs(redis) - before
        assert runs == -(-many // RECORD_BATCH)
        assert runs > 1
        org = await redis.hmget(keyspace.llm_usage_org("many-org", this_month), FIELDS)
        assert [text(v) for v in org] == ["500", str(many), str(2 * many), str(many)]
        user = await redis.hget(keyspace.llm_usage_user("many-u0", this_month), "requests")
        assert int(user or 0) == 1 + len(range(0, many, 7))
    finally:
        await redis.aclose()


async def test_a_failed_batch_is_one_log_line_naming_what_was_lost(
    make_config: Callable[..., ServiceConfig], redis_url: str
) -> None:
    """A usage write that fails (here: a conversation's usage key of another type, so the
    script errs) is logged once for its batch, with the calls, users and cost it lost, not a
    traceback per call (a batch after a Redis stall holds thousands)."""
    server = await start_live_server(make_config(llm_prices=PRICES), with_sandboxes=False)
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await redis.set(keyspace.llm_usage_conversation("lost-c"), "not a hash")
        gateway = server.app[keys.GATEWAY]
        with capture_logs("info") as logs:
            for n in range(30):
                gateway._queue_record(Record(f"lost-u{n % 3}", "lost-c", Usage(1, 1, 0.5)))
            await gateway.recorded()
        (line,) = logs.events("llm_usage_not_recorded")
        assert line["calls"] == 30, line
        assert line["users"] == 3, line
        assert line["cost"] == 15.0, line
        assert line["cost_by_user"] == {f"lost-u{n}": 5.0 for n in range(3)}, line
    finally:
        await redis.aclose()
        await server.close()
