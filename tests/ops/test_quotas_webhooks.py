"""Total and host-capacity quotas (429 with Retry-After, nothing created) and signed lifecycle
webhooks with retries, against a local receiver. Real Docker and Redis."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.support.hook_server import HookServer
from tests.support.sandbox_helpers import start, wait_status
from tests.support.types import Client, ClientFactory

pytestmark = pytest.mark.usefixtures("sandbox_images")
SECRET = "webhook-secret-0123456789"


async def test_total_sandboxes_per_user(
    make_sandbox_client: ClientFactory, user_headers: Any
) -> None:
    client: Client = await make_sandbox_client(max_sandboxes_per_user=2)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    first = (await start(client, alice))["id"]
    second = (await start(client, alice))["id"]
    await wait_status(client, alice, first, "RUNNING")
    assert (await client.post(f"/api/v1/sandboxes/{first}/pause", headers=alice)).status == 200

    resp = await client.post("/api/v1/sandboxes", json={}, headers=alice)
    assert resp.status == 429
    assert int(resp.headers["Retry-After"]) > 0
    assert "per-user total" in (await resp.json())["detail"]
    listing = await (await client.get("/api/v1/sandboxes/search", headers=alice)).json()
    assert sorted(s["id"] for s in listing["items"]) == sorted([first, second])
    assert (await client.post("/api/v1/sandboxes", json={}, headers=bob)).status == 200


async def test_host_capacity_counts_paused_memory(
    make_sandbox_client: ClientFactory, user_headers: Any
) -> None:
    mib = 1024**2
    client: Client = await make_sandbox_client(host_memory_bytes=96 * mib)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    first = (await start(client, alice))["id"]  # the default spec reserves 64 MiB
    await wait_status(client, alice, first, "RUNNING")

    resp = await client.post("/api/v1/sandboxes", json={}, headers=bob)
    assert resp.status == 429
    assert "memory" in (await resp.json())["detail"]
    assert resp.headers["Retry-After"]

    assert (await client.post(f"/api/v1/sandboxes/{first}/pause", headers=alice)).status == 200
    resp = await client.post("/api/v1/sandboxes", json={}, headers=bob)
    assert resp.status == 429, "a paused container keeps its memory"

    assert (await client.delete(f"/api/v1/sandboxes/{first}", headers=alice)).status == 200
    second = await start(client, bob)
    await wait_status(client, bob, second["id"], "RUNNING")


class Receiver(HookServer):
    """A webhook receiver (tests/support/hook_server.py) that fails the first `failures`
    deliveries with 503."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0
        self.accepted: list[tuple[dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.attempts += 1
        body = await request.read()
        if self.failures > 0:
            self.failures -= 1
            return web.Response(status=503)
        self.accepted.append((dict(request.headers), body))
        return web.Response(status=204)


@pytest.fixture
async def receiver_failing_twice() -> AsyncIterator[Receiver]:
    async with Receiver(failures=2) as hook:
        yield hook


async def test_lifecycle_webhooks_signed_and_retried(
    make_sandbox_client: ClientFactory,
    user_headers: Any,
    admin_headers: dict[str, str],
    receiver_failing_twice: Receiver,
) -> None:
    client: Client = await make_sandbox_client(
        lifecycle_webhook_urls=[receiver_failing_twice.url],
        lifecycle_webhook_secret=SECRET,
        lifecycle_webhook_timeout=0.5,  # retries come one attempt time (+2 s) after the last
    )
    alice = await user_headers("alice")
    sandbox = await start(client, alice)
    running = await wait_status(client, alice, sandbox["id"], "RUNNING")
    assert (
        await client.post(f"/api/v1/sandboxes/{sandbox['id']}/pause", headers=alice)
    ).status == 200
    assert (await client.delete(f"/api/v1/sandboxes/{sandbox['id']}", headers=alice)).status == 200

    deadline = time.monotonic() + 30
    while len(receiver_failing_twice.accepted) < 4:
        assert time.monotonic() < deadline, receiver_failing_twice.accepted
        await asyncio.sleep(0.05)
    assert receiver_failing_twice.attempts == len(receiver_failing_twice.accepted) + 2, (
        "two 503s were retried"
    )
    types = []
    for headers, body in receiver_failing_twice.accepted:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-ACS-Signature"], expected)
        event = json.loads(body)
        assert headers["X-ACS-Event"] == event["type"]
        assert event["sandbox_id"] == sandbox["id"]
        assert running["session_api_key"] not in body.decode()
        assert headers["X-ACS-Delivery"] == event["id"]
        types.append((event["timestamp"], event["type"]))
    # At least once, not in order (a retried event comes after later ones): by timestamp.
    assert [t for _when, t in sorted(types)] == [
        "sandbox.created",
        "sandbox.running",
        "sandbox.paused",
        "sandbox.deleted",
    ]
    # The outbox is empty and /metrics says so, with what it took.
    resp = await client.get("/metrics", headers=admin_headers)
    samples = dict(
        line.split(" ", 1) for line in (await resp.text()).splitlines() if line.startswith("acs_")
    )
    assert float(samples["acs_lifecycle_webhooks_pending"]) == 0
    assert float(samples["acs_lifecycle_webhooks_delivered_total"]) == 4
    assert float(samples["acs_lifecycle_webhooks_retried_total"]) == 2
    assert float(samples["acs_lifecycle_webhooks_dead_lettered_total"]) == 0
