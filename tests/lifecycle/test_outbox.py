"""Lifecycle webhooks are durable: the outbox in Redis (real redis-server), delivered at least once
to a real HTTP receiver with the same delivery id on every attempt, across a SIGKILLed deliverer
and two replicas, dead-lettered after their time, visible in the metrics."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from controlplane import gauges, keys
from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.outbox import GROUP, Outbox, url_id
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.lifecycle.webhooks import DeliveryHooks, RetryPolicy, WebhookDeliverer
from controlplane.metrics import Metrics
from controlplane.outbound.client import OutboundClient
from controlplane.outbound.policy import OutboundPolicy
from controlplane.store import keyspace
from tests.support.hook_server import HookServer
from tests.support.records import NO_ENGINE

SECRET = "outbox-test-secret-0123456789"
REPO = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(base=0.1, cap=1.0, dead_after=3600, timeout=0.5, margin=0.2)


class Receiver(HookServer):
    """A webhook receiver (tests/support/hook_server.py) that can answer 503 to the first
    `refusals` attempts of each event, and records every attempt it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0
        self.seen: list[dict[str, str]] = []  # every attempt that reached it
        self.accepted: list[tuple[str, dict[str, Any]]] = []  # (delivery id, event)
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.seen.append(headers)
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("X-ACS-Signature", ""), expected):
            return web.Response(status=401)
        delivery = headers["X-ACS-Delivery"]
        if sum(1 for h in self.seen if h["X-ACS-Delivery"] == delivery) <= self.refusals:
            return web.Response(status=503)
        await asyncio.sleep(self.delay)
        self.accepted.append((delivery, json.loads(body)))
        return web.Response(status=204)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver() as hook:
        yield hook


def events(n: int) -> list[LifecycleEvent]:
    return [
        LifecycleEvent(type=LifecycleType.SANDBOX_PAUSED, user_id="alice", sandbox_id=f"s{i}")
        for i in range(n)
    ]


async def publish(redis: aioredis.Redis, outbox: Outbox, batch: list[LifecycleEvent]) -> None:
    publisher = LifecyclePublisher(redis, outbox)
    for event in batch:
        await publisher.publish(event)


@pytest.fixture
async def outbound() -> AsyncIterator[OutboundClient]:
    """The deliverer's client, as the wiring makes it: the operator's outbound policy."""
    client = OutboundClient(OutboundPolicy(scope="operator"))
    yield client
    await client.close()


async def until(check: Callable[[], bool], seconds: float, what: Any) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what() if callable(what) else what
        await asyncio.sleep(0.05)


async def test_a_receiver_down_then_up_gets_every_event_with_its_delivery_id(
    raw_redis: aioredis.Redis, outbound: OutboundClient, receiver: Receiver
) -> None:
    counts: Counter[str] = Counter()
    hooks = DeliveryHooks(
        delivered=lambda: counts.update(["delivered"]),
        retried=lambda: counts.update(["retried"]),
        dead_lettered=lambda: counts.update(["dead"]),
    )
    outbox = Outbox(raw_redis, [receiver.url])
    deliverer = WebhookDeliverer(outbox, outbound, SECRET, FAST, hooks=hooks, poll=0.1)
    deliverer.start()
    try:
        await receiver.down()
        batch = events(10)
        await publish(raw_redis, outbox, batch)
        # Down: every event is attempted and fails (connection refused), more than once.
        await until(lambda: counts["retried"] >= 20, 15, counts)
        assert await outbox.pending() == 10
        # Up, answering 503 to each event's first two attempts it sees: retried again.
        receiver.refusals = 2
        await receiver.up()
        await until(lambda: len({d for d, _e in receiver.accepted}) == 10, 30, receiver.seen)
        # The receiver has its answer before the deliverer acknowledges the entry (the hook
        # follows the XACK): closing at once cut the last acknowledgement off.
        await until(lambda: counts["delivered"] == 10, 10, counts)
    finally:
        await deliverer.close()
    assert {d for d, _e in receiver.accepted} == {e.id for e in batch}
    for delivery, event in receiver.accepted:
        assert event["id"] == delivery  # the delivery id is the event id
        attempts = [
            int(h["X-ACS-Attempt"]) for h in receiver.seen if h["X-ACS-Delivery"] == delivery
        ]
        assert len(attempts) >= 3, attempts  # two 503s, then accepted
        assert attempts == sorted(attempts)
        assert attempts[0] >= 2, "the first attempts failed while the receiver was down"
    assert await outbox.pending() == 0
    assert counts["delivered"] == 10
    assert counts["dead"] == 0


async def _worker(redis_url: str, url: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.outbox_worker",
        redis_url,
        url,
        SECRET,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"ready", line
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
    await proc.wait()


async def test_a_deliverer_killed_mid_backlog_leaves_the_rest_to_the_next(
    redis_url: str, raw_redis: aioredis.Redis, receiver: Receiver
) -> None:
    receiver.delay = 0.05
    outbox = Outbox(raw_redis, [receiver.url])
    await outbox.ensure_group(receiver.url)
    batch = events(40)
    await publish(raw_redis, outbox, batch)
    first = await _worker(redis_url, receiver.url)
    try:
        await until(lambda: len(receiver.accepted) >= 8, 30, receiver.accepted)
        first.send_signal(signal.SIGKILL)  # mid-backlog, maybe mid-attempt
        await first.wait()
        done_before = len(receiver.accepted)
        assert done_before < 40
        second = await _worker(redis_url, receiver.url)  # the control plane, restarted
        try:
            await until(
                lambda: {d for d, _e in receiver.accepted} == {e.id for e in batch},
                60,
                lambda: (len(receiver.accepted), done_before),
            )
            # The attempt the kill cut off may have reached the receiver unacknowledged: the
            # second deliverer sends it again once it is due, and only then is the outbox empty.
            deadline = time.monotonic() + 30
            while await outbox.pending():
                assert time.monotonic() < deadline, await outbox.pending()
                await asyncio.sleep(0.1)
        finally:
            await _stop(second)
    finally:
        await _stop(first)
    ids = [d for d, _e in receiver.accepted]
    repeats = [d for d, n in Counter(ids).items() if n > 1]
    assert len(repeats) <= 1, repeats  # at most the one attempt the kill cut off
    assert await outbox.pending() == 0


async def test_two_replicas_never_deliver_the_same_event_twice(
    redis_url: str, raw_redis: aioredis.Redis, receiver: Receiver
) -> None:
    # Both replicas wait on the stream when a burst arrives in one write: Redis handed the
    # first up to a read's worth (16 before the fix), the other the rest. The receiver is slow
    # enough that sending 16 one after another takes longer than the wait after which a
    # pending entry may be claimed (the worker's timeout + margin, 4 s), and the other replica
    # is idle by then: still one delivery per event.
    receiver.delay = 0.4
    outbox = Outbox(raw_redis, [receiver.url])
    await outbox.ensure_group(receiver.url)
    key = keyspace.webhook_outbox(url_id(receiver.url))
    replicas = [await _worker(redis_url, receiver.url) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while sum(c["cmd"] == "xreadgroup" for c in await raw_redis.client_list()) < 2:
            assert time.monotonic() < deadline, "the replicas never read the outbox"
            await asyncio.sleep(0.02)
        batch = events(24)
        publisher = LifecyclePublisher(raw_redis, outbox)
        async with raw_redis.pipeline(transaction=True) as pipe:
            for event in batch:
                publisher.entry(event).queue(pipe)
            await pipe.execute()
        await until(lambda: len(receiver.accepted) >= 24, 60, lambda: len(receiver.accepted))
        # Every acceptance acknowledged (a loaded host may take a while after the last 204).
        deadline = time.monotonic() + 30
        while await outbox.pending():
            assert time.monotonic() < deadline, await outbox.pending()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # time for a duplicate to show up, if there were one
        consumers: Any = await raw_redis.xinfo_consumers(key, GROUP)
    finally:
        for proc in replicas:
            await _stop(proc)
    ids = [d for d, _e in receiver.accepted]
    assert sorted(ids) == sorted(e.id for e in batch)
    assert len(set(ids)) == len(ids), "an event was delivered twice"
    assert len(consumers) == 2
    assert all(int(c["pending"]) == 0 for c in consumers)


async def test_failing_deliveries_are_dead_lettered_and_counted(
    raw_redis: aioredis.Redis, outbound: OutboundClient, receiver: Receiver
) -> None:
    receiver.refusals = 10**6  # a receiver that always answers 503
    metrics = Metrics()
    outbox = Outbox(raw_redis, [receiver.url])
    policy = RetryPolicy(base=0.1, cap=0.5, dead_after=1.5, timeout=0.5, margin=0.1)
    hooks = DeliveryHooks(
        delivered=metrics.webhook_delivered.inc,
        retried=metrics.webhook_retried.inc,
        dead_lettered=metrics.webhook_dead_lettered.inc,
    )
    batch = events(3)
    await publish(raw_redis, outbox, batch)
    await gauges.refresh(metrics, raw_redis, outbox)
    assert _sample(metrics, "acs_lifecycle_webhooks_pending") == 3
    deliverer = WebhookDeliverer(outbox, outbound, SECRET, policy, hooks=hooks, poll=0.1)
    deliverer.start()
    try:
        await until(lambda: len(receiver.seen) >= 3, 10, receiver.seen)
        dead = await _wait_dead(outbox, receiver.url, 3)
    finally:
        await deliverer.close()
    assert {json.loads(d["e"])["id"] for d in dead} == {e.id for e in batch}
    for entry in dead:
        assert entry["error"] == "HTTP 503"
        assert int(entry["attempts"]) >= 2
    assert await outbox.pending() == 0
    await gauges.refresh(metrics, raw_redis, outbox)
    assert _sample(metrics, "acs_lifecycle_webhooks_pending") == 0
    assert _sample(metrics, "acs_lifecycle_webhooks_dead_lettered_total") == 3
    assert _sample(metrics, "acs_lifecycle_webhooks_retried_total") >= 3
    assert _sample(metrics, "acs_lifecycle_webhooks_delivered_total") == 0


async def _wait_dead(outbox: Outbox, url: str, n: int) -> list[dict[str, str]]:
    deadline = time.monotonic() + 15
    while True:
        dead = await outbox.dead(url)
        if len(dead) >= n:
            return dead
        assert time.monotonic() < deadline, dead
        await asyncio.sleep(0.1)


def _sample(metrics: Metrics, name: str) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics")


async def test_dead_letters_are_readable_by_admins(
    make_client: Callable[..., Awaitable[Any]],
    user_headers: Callable[..., Awaitable[dict[str, str]]],
    admin_headers: dict[str, str],
    receiver: Receiver,
) -> None:
    receiver.refusals = 10**6  # always 503
    client = await make_client(
        with_sandboxes=True,
        docker_url=NO_ENGINE,  # the webhooks need no engine
        lifecycle_webhook_urls=[receiver.url],
        lifecycle_webhook_secret=SECRET,
        lifecycle_webhook_timeout=0.2,
        lifecycle_webhook_dead_after=1.0,
    )
    url = "/api/v1/lifecycle-events/dead-letters"
    assert await (await client.get(url, headers=admin_headers)).json() == {"items": []}
    batch = events(2)
    for event in batch:
        await client.app[keys.LIFECYCLE].publish(event)
    deadline = time.monotonic() + 20
    while True:
        body = await (await client.get(url, headers=admin_headers)).json()
        if len(body["items"]) == 2:
            break
        assert time.monotonic() < deadline, (body, receiver.seen)
        await asyncio.sleep(0.2)
    assert {d["event"]["id"] for d in body["items"]} == {e.id for e in batch}
    for dead in body["items"]:
        assert dead["url_id"] == url_id(receiver.url)
        assert dead["error"] == "HTTP 503"
        assert dead["attempts"] >= 2
    refused = await client.get(url, headers=await user_headers("alice"))
    assert refused.status == 403
    metrics = await (await client.get("/metrics", headers=admin_headers)).text()
    assert "acs_lifecycle_webhooks_dead_lettered_total 2.0" in metrics
    assert "acs_lifecycle_webhooks_pending 0.0" in metrics
