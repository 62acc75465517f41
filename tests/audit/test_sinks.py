"""The audit log's sinks: a webhook the operator names gets every entry, signed, through the
outbound policy of operator URLs (a link-local address is never connected to); standard output
gets every entry as one JSON line, the same JSON the search answers."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from controlplane.lifecycle.outbox import url_id
from controlplane.store import keyspace, text
from tests.conftest import BOOTSTRAP_KEY
from tests.support.hook_server import HookServer
from tests.support.types import Client, ClientFactory

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
SECRET = "audit-sink-secret-0123456789"
SEARCH = "/api/v1/audit-events/search"


class Sink(HookServer):
    """Accepts signed entries; refuses (401) what is not signed with SECRET."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(request.headers.get("X-ACS-Signature", ""), expected):
            return web.Response(status=401)
        self.accepted.append((dict(request.headers), json.loads(body)))
        return web.Response(status=204)


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    async with Sink() as hook:
        yield hook


async def until(check: Callable[[], Any], seconds: float, what: Any) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what() if callable(what) else what
        await asyncio.sleep(0.05)


async def act(client: Client) -> list[dict[str, Any]]:
    """A few audited actions; the entries the search then answers."""
    org = {"id": "eng", "name": "Eng", "owner": "olivia"}
    async with client.post("/api/organizations", headers=ADMIN, json=org) as resp:
        assert resp.status == 201
    async with client.post("/api/v1/keys", headers=ADMIN, json={"name": "ci"}) as resp:
        key = (await resp.json())["key_id"]
    async with client.delete(f"/api/v1/keys/{key}", headers=ADMIN) as resp:
        assert resp.status == 200
    async with client.get(SEARCH, headers=ADMIN) as resp:
        items: list[dict[str, Any]] = (await resp.json())["items"]
    assert {e["event"]["action"] for e in items} >= {"org.create", "key.create", "key.revoke"}
    return items


async def test_a_webhook_sink_gets_every_entry_signed(
    make_client: ClientFactory, sink: Sink
) -> None:
    client = await make_client(audit_sink_urls=[sink.url], audit_sink_secret=SECRET)
    entries = await act(client)

    async def all_in() -> bool:
        return len(sink.accepted) >= len(entries)

    await until(all_in, 20, lambda: sink.accepted)
    by_id = {body["event"]["id"]: (headers, body) for headers, body in sink.accepted}
    assert len(by_id) == len(sink.accepted)  # once each, here
    for entry in entries:
        headers, body = by_id[entry["event"]["id"]]
        assert body == entry
        assert headers["X-ACS-Event"] == "audit"
        assert headers["X-ACS-Delivery"] == entry["event"]["id"]


async def test_a_sink_at_a_link_local_address_is_never_connected_to(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    url = "http://169.254.169.254/latest/meta-data"
    client = await make_client(
        audit_sink_urls=[url],
        lifecycle_webhook_timeout=0.2,
        lifecycle_webhook_retry_base=0.1,
        lifecycle_webhook_dead_after=0.5,
    )
    entries = await act(client)
    dead = keyspace.audit_dead(url_id(url))

    async def all_dead() -> bool:
        return int(await raw_redis.xlen(dead)) >= len(entries)

    await until(all_dead, 30, "not dead-lettered")
    rows: Any = await raw_redis.xrange(dead)
    for _, fields in rows:
        error = text(fields[b"error"])
        assert error.startswith("DestinationRefused: 169.254.169.254"), error  # never connected
        assert json.loads(text(fields[b"e"]))["event"]["id"]


async def test_stdout_gets_every_entry_as_a_json_line(
    make_client: ClientFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    client = await make_client(audit_stdout=True)
    entries = await act(client)
    seen: dict[str, dict[str, Any]] = {}

    async def all_printed() -> bool:
        for line in capfd.readouterr().out.splitlines():
            if line.startswith('{"@timestamp"'):
                entry = json.loads(line)
                seen[entry["event"]["id"]] = entry
        return len(seen) >= len(entries)

    await until(all_printed, 20, lambda: seen)
    for entry in entries:
        assert seen[entry["event"]["id"]] == entry
