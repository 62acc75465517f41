"""A lifecycle webhook deliverer alone in a process: what each control plane replica runs, for
tests that kill one with SIGKILL or run two side by side.

    python -m tests.support.outbox_worker <redis url> <webhook url> <secret>

Prints "ready" once delivering, then runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from controlplane.lifecycle.outbox import Outbox
from controlplane.lifecycle.webhooks import RetryPolicy, WebhookDeliverer
from controlplane.outbound.client import OutboundClient
from controlplane.outbound.policy import OutboundPolicy

# Fast retries for tests: a retry comes 4 s after an attempt at the soonest. An attempt may take
# 2 s: the receivers run in the loaded test process, and with 0.5 s one answering a slow test's
# 0.25 s delay late made the worker time out and send the event again (at least once, by
# design), which read as a double delivery. The margin is production's (2 s): two worker
# processes on a loaded host may each stall that long between a delivery and its
# acknowledgement, and a shorter one let the other claim it.
POLICY = RetryPolicy(base=0.1, cap=1.0, dead_after=3600, timeout=2.0, margin=2.0)


async def main(redis_url: str, url: str, secret: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    http = OutboundClient(OutboundPolicy(scope="operator"))
    deliverer = WebhookDeliverer(Outbox(redis, [url]), http, secret, POLICY, poll=0.1)
    deliverer.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
