"""Readiness from the agent server's own announcement (issue 12): ours POSTs `<webhook base>/ready`
once it listens, and the start waiting for it probes /health at that moment instead of polling;
without an announcement a start is still found, by slow polling; only the sandbox's own key is
accepted, also from inside another sandbox."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from agent.announce import announce
from controlplane.sandboxes import readiness
from controlplane.sandboxes.readiness import ReadinessProbe
from controlplane.sandboxes.status_feed import StatusFeed
from drivers.base import Endpoint
from drivers.docker.driver import DockerDriver
from tests.support.log_capture import capture_logs
from tests.support.sandbox_helpers import OwnDocker, exec_as_agent, start, wait_status
from tests.support.types import Client, UserHeaders


class FakeBootingAgent:
    """A real HTTP server standing in for a booting agent server: /health answers 503 until
    `up`, and every probe is counted."""

    def __init__(self) -> None:
        self.up = False
        self.hits = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    async def _health(self, _request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(status=200 if self.up else 503)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def booting() -> AsyncIterator[FakeBootingAgent]:
    agent = FakeBootingAgent()
    await agent.start()
    yield agent
    await agent.stop()


@pytest.fixture
async def probe(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ReadinessProbe]:
    # No Docker inspection of the made-up container names during these tests.
    monkeypatch.setattr(readiness, "INSPECT_AFTER", 600.0)
    driver = DockerDriver()
    async with aiohttp.ClientSession() as http:
        probe = ReadinessProbe(http, driver, timeout=60)
        yield probe
        await probe.close()
    await driver.close()


async def test_an_announcing_boot_is_probed_once_then_at_its_announcement(
    probe: ReadinessProbe, booting: FakeBootingAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readiness, "ANNOUNCED_FALLBACK", 600.0)
    wait = asyncio.create_task(probe.wait("box-a", booting.endpoint, announced=True))
    await asyncio.sleep(0.6)
    assert not wait.done()
    assert booting.hits == 1, "only the first probe, made at once, before the announcement"
    booting.up = True
    probe.hint("box-a")
    await asyncio.wait_for(wait, 10)
    assert booting.hits == 2


async def test_a_boot_that_does_not_announce_is_polled(
    probe: ReadinessProbe, booting: FakeBootingAgent
) -> None:
    wait = asyncio.create_task(probe.wait("box-b", booting.endpoint))
    await asyncio.sleep(1.0)
    assert booting.hits >= 4, "polled every 20 ms backing off to 100 ms"
    booting.up = True
    await asyncio.wait_for(wait, 10)


async def test_a_lost_announcement_costs_time_not_the_start(
    probe: ReadinessProbe, booting: FakeBootingAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readiness, "ANNOUNCED_FALLBACK", 0.3)
    wait = asyncio.create_task(probe.wait("box-c", booting.endpoint, announced=True))
    await asyncio.sleep(0.1)
    booting.up = True  # up, but the announcement never comes
    await asyncio.wait_for(wait, 10)
    assert booting.hits == 2


async def test_an_announcement_before_the_wait_is_remembered(
    probe: ReadinessProbe, booting: FakeBootingAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readiness, "ANNOUNCED_FALLBACK", 600.0)
    probe.hint("box-d")  # the agent was quicker than the launcher's bookkeeping
    wait = asyncio.create_task(probe.wait("box-d", booting.endpoint, announced=True))
    await asyncio.sleep(0.2)
    booting.up = True
    await asyncio.wait_for(wait, 10)  # polled quickly, as an announced agent is
    assert booting.hits >= 3


async def test_the_agent_retries_its_announcement_and_gives_up_quietly() -> None:
    calls: list[tuple[str, str | None]] = []
    answers = [503, 200]

    async def ready(request: web.Request) -> web.Response:
        calls.append((request.path, request.headers.get("X-Session-API-Key")))
        return web.Response(status=answers.pop(0) if answers else 401)

    app = web.Application()
    app.router.add_post("/api/v1/webhooks/sbx1/ready", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        base = f"http://127.0.0.1:{port}/api/v1/webhooks/sbx1/"
        assert await announce(base, "the-key") is True
        assert calls == [("/api/v1/webhooks/sbx1/ready", "the-key")] * 2
        assert await announce(base, "the-key") is False  # a refusal is not retried
        assert len(calls) == 3
    finally:
        await runner.cleanup()
    assert await announce(f"http://127.0.0.1:{port}/x", None) is False  # nobody listens


async def test_an_announcement_reaches_the_replica_whose_start_waits(redis_url: str) -> None:
    """The webhook may land on another replica (they share the listener's port): it relays the
    announcement through Redis, and it is not taken for a status change."""
    here, there = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    heard: asyncio.Queue[str] = asyncio.Queue()
    sender, receiver = StatusFeed(here), StatusFeed(there, on_listening=heard.put_nowait)
    receiver.start()
    try:
        with receiver.watch("sbx-relayed") as changed:
            got = None
            for _ in range(50):  # until the receiver's subscription is up
                await sender.relay_listening("sbx-relayed")
                try:
                    got = await asyncio.wait_for(heard.get(), 0.2)
                    break
                except TimeoutError:
                    continue
            assert got == "sbx-relayed"
            changed.clear()  # the feed wakes every waiter once when it (re)subscribes
            await sender.relay_listening("sbx-relayed")
            assert await asyncio.wait_for(heard.get(), 10) == "sbx-relayed"
            assert not changed.is_set()
    finally:
        await receiver.stop()
        await here.aclose()
        await there.aclose()


_POST_READY = r"""
import json, os, sys, urllib.request, urllib.error
base = os.environ["OH_WEBHOOKS_0_BASE_URL"].rsplit("/", 1)[0]
own = os.environ["OH_SESSION_API_KEYS_0"]
out = []
for target, key in json.loads(sys.argv[1]):
    headers = {"X-Session-API-Key": own} if key else {}
    request = urllib.request.Request(f"{base}/{target}/ready", data=b"", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            out.append(resp.status)
    except urllib.error.HTTPError as exc:
        out.append(exc.code)
print(json.dumps(out))
"""


async def test_sandboxes_announce_themselves_with_their_own_key_only(
    sbx: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No fallback poll: on a loaded host it could find the agent up before its announcement
    # is handled, and the start would not show that it waited for the announcement.
    monkeypatch.setattr(readiness, "ANNOUNCED_FALLBACK", 600.0)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    with capture_logs("info") as logs:
        mine = await start(sbx, alice)
        await wait_status(sbx, alice, mine["id"], "RUNNING")
        theirs = await start(sbx, bob)
        await wait_status(sbx, bob, theirs["id"], "RUNNING")
    for sandbox_id in (mine["id"], theirs["id"]):
        announced = [
            r
            for r in logs.events("request")
            if r["route"] == "/api/v1/webhooks/{sandbox_id}/ready"
            and r["path"] == f"/api/v1/webhooks/{sandbox_id}/ready"
        ]
        assert [r["status"] for r in announced] == [200], announced
        running = [
            r
            for r in logs.events("lifecycle")
            if r["sandbox_id"] == sandbox_id and r["type"] == "sandbox.running"
        ]
        # The announcement is what the start waited for: heard before the sandbox is RUNNING
        # (the request's own log line comes after its handler and its durable write, so it
        # may follow the RUNNING the handler woke).
        records = logs.records()
        (heard,) = [
            r
            for r in records
            if r.get("event") == "sandbox_agent_listening" and r.get("sandbox_id") == sandbox_id
        ]
        assert records.index(heard) < records.index(running[0])

    # From inside alice's sandbox, as its agent user: her own key on bob's sandbox, no key on
    # hers; both refused. Her own, on hers, is taken.
    (box,) = [c for c in own_docker.containers() if c.name.endswith(mine["id"])]
    targets = [[theirs["id"], True], [mine["id"], False], [mine["id"], True]]
    code, out = await asyncio.to_thread(
        exec_as_agent, box, "python3", "-c", _POST_READY, json.dumps(targets)
    )
    assert code == 0, out
    assert json.loads(out.splitlines()[-1]) == [401, 401, 200]
