"""Load for the high-availability tests: clients reading, starting conversations and creating
sandboxes, a sandbox posting events as its agent server does, and a front end following them on
the events WebSocket (attaching again after its last event when its replica goes away); and the
checks that nothing acknowledged was lost."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.support.live_server import Api
from tests.support.records import event

READERS = 3
START_EVERY = 1.5
STARTS = 8
"""Conversation starts and sandbox creates in all (each a container on this shared host)."""
EVENT_EVERY = 0.1
READS = (
    "/api/v1/sandboxes/search?limit=5",
    "/api/settings",
    "/api/v1/app-conversations/search?limit=5",
)


@dataclass
class Outcome:
    method: str
    path: str
    sent: float
    status: int | str
    took: float = 0.0


@dataclass
class Load:
    """What the clients sent and were told."""

    outcomes: list[Outcome] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    sandboxes: list[str] = field(default_factory=list)
    attempted: list[str] = field(default_factory=list)
    posted: list[str] = field(default_factory=list)
    received: list[str] = field(default_factory=list)
    reattached: int = 0

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not (isinstance(o.status, int) and o.status < 300)]


async def call(api: Api, load: Load, method: str, path: str, **kwargs: Any) -> Any:
    sent = time.monotonic()
    try:
        status, body = await api.call(method, path, **kwargs)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        load.outcomes.append(Outcome(method, path, sent, type(exc).__name__))
        return None
    except json.JSONDecodeError:  # not our JSON: the balancer's own error page, say
        load.outcomes.append(Outcome(method, path, sent, "answer not JSON"))
        return None
    load.outcomes.append(Outcome(method, path, sent, status, time.monotonic() - sent))
    return body if status < 300 else None


async def reader(api: Api, load: Load, n: int) -> None:
    while True:
        await call(api, load, "GET", READS[n % len(READS)])
        n += 1
        await asyncio.sleep(0.02)


async def starter(api: Api, load: Load) -> None:
    """A conversation start, then a sandbox create, and so on, STARTS in all."""
    for n in range(STARTS):
        if n % 2 == 0:
            body = await call(api, load, "POST", "/api/v1/app-conversations", json={})
            if body is not None:
                load.tasks.append(body["id"])
        else:
            body = await call(api, load, "POST", "/api/v1/sandboxes", json={})
            if body is not None:
                load.sandboxes.append(body["id"])
        await asyncio.sleep(START_EVERY)


async def agent(api: Api, load: Load, sandbox: dict[str, Any], conversation: str) -> None:
    """Posts events as the sandbox's agent server does (its session key, the webhook route)."""
    path = f"/api/v1/webhooks/{sandbox['id']}/events/{conversation}"
    headers = {"X-Session-API-Key": sandbox["session_api_key"]}
    while True:
        one = event(source="environment", kind="ObservationEvent")
        load.attempted.append(one["id"])
        sent = time.monotonic()
        try:
            async with api.http.post(api.base + path, json=[one], headers=headers) as resp:
                status: int | str = resp.status
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            status = type(exc).__name__
        took = time.monotonic() - sent
        load.outcomes.append(Outcome("POST", "/api/v1/webhooks/…/events/…", sent, status, took))
        if status == 200:
            load.posted.append(one["id"])
        await asyncio.sleep(EVENT_EVERY)


async def follower(api: Api, load: Load, conversation: str) -> None:
    """The events WebSocket through the balancer; when its replica goes away, attach again
    after the last event received, as a front end does."""
    while True:
        query = f"conversation_id={conversation}&session_api_key={api.key}"
        if load.received:
            query += f"&after={load.received[-1]}"
        try:
            async with api.http.ws_connect(f"{api.base}/api/v1/events/socket?{query}") as ws:
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        one = json.loads(message.data)
                        if one.get("kind") == "ObservationEvent":
                            load.received.append(one["id"])
        except (aiohttp.ClientError, ConnectionError):
            pass
        load.reattached += 1
        await asyncio.sleep(0.05)


async def ready_conversation(api: Api) -> tuple[dict[str, Any], str]:
    """A ready conversation and its sandbox (with the session key its agent uses)."""
    task = await api.ok("POST", "/api/v1/app-conversations", json={})
    task = await finished(api, task["id"], within=90)
    assert task["status"] == "READY", task
    sandbox = await api.ok("GET", f"/api/v1/sandboxes/{task['sandbox_id']}")
    return sandbox, task["app_conversation_id"]


async def finished(api: Api, task_id: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        (task,) = await api.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task_id}")
        if task["status"] in ("READY", "ERROR") or time.monotonic() > deadline:
            return dict(task)
        await asyncio.sleep(0.2)


async def settled(api: Api, load: Load, within: float) -> None:
    """Every acknowledged start READY, every acknowledged sandbox RUNNING, every event posted
    received on the socket, once each, in order (one whose post failed may have been stored
    before its replica died: then it is received too)."""
    deadline = time.monotonic() + within
    for task_id in load.tasks:
        task = await finished(api, task_id, max(1.0, deadline - time.monotonic()))
        assert task["status"] == "READY", task
    for sandbox_id in load.sandboxes:
        while True:
            sandbox = await api.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
            if sandbox["status"] != "STARTING" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert sandbox["status"] == "RUNNING", sandbox
    while time.monotonic() < deadline:
        if set(load.posted) <= set(load.received):
            break
        await asyncio.sleep(0.1)
    expected = [e for e in load.attempted if e in set(load.posted) | set(load.received)]
    assert load.received == expected


class Traffic:
    """The load's tasks, started and stopped together."""

    def __init__(
        self,
        api: Api,
        load: Load,
        sandbox: dict[str, Any],
        conversation: str,
        *,
        starts: bool = True,
    ) -> None:
        """`starts`: also the periodic starter (its STARTS conversations and sandboxes)."""
        self.tasks = [asyncio.create_task(reader(api, load, n)) for n in range(READERS)]
        if starts:
            self.tasks.append(asyncio.create_task(starter(api, load)))
        self.tasks.append(asyncio.create_task(follower(api, load, conversation)))
        self.tasks.append(asyncio.create_task(agent(api, load, sandbox, conversation)))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
