"""/metrics reads the gauges from Redis at scrape time: scrapes that arrive together share one
refresh instead of starting one each (controlplane/gauges.py, Refresher). Counted with Redis's
own command statistics (a refresh's SCARDs of the status sets), not with a hook in the code."""

from __future__ import annotations

import asyncio
import secrets

import redis.asyncio as aioredis

from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from tests.support.types import ClientFactory

SCRAPES = 20


async def refreshes(raw_redis: aioredis.Redis) -> int:
    """SCARD calls so far: a refresh makes one per status set."""
    stats = await raw_redis.info("commandstats")
    return int(stats.get("cmdstat_scard", {}).get("calls", 0))


async def test_scrapes_at_once_share_one_walk_and_all_get_the_figures(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(metrics_public=True)
    store = ConversationStore(raw_redis)
    for _ in range(30):
        await store.save(
            AppConversationInfo(
                id=secrets.token_hex(16), created_by_user_id="alice", sandbox_id="s1"
            )
        )
    before = await refreshes(raw_redis)
    assert (await client.get("/metrics")).status == 200
    one_walk = await refreshes(raw_redis) - before
    assert one_walk >= 1

    before = await refreshes(raw_redis)
    answers = await asyncio.gather(*(client.get("/metrics") for _ in range(SCRAPES)))
    texts = [await a.text() for a in answers]
    walked = await refreshes(raw_redis) - before
    assert all(a.status == 200 for a in answers)
    assert all('acs_conversations{execution_status="unknown"} 30.0' in t for t in texts), texts[0]
    # One walk in flight at a time: the crowd costs a few walks, not one each.
    assert walked <= 3 * one_walk, (walked, one_walk)
