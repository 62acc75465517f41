"""Background commands: start_bash_command, bash_events/search, stop, clear (as the official
agent server, which RemoteWorkspace.execute_command polls)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import agent.bash
from agent.bash import _Stream
from tests.support.types import Client

START = "/api/bash/start_bash_command"
SEARCH = "/api/bash/bash_events/search"


async def start(client: Client, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    resp = await client.post(START, json=body, headers=auth)
    assert resp.status == 200, await resp.text()
    command: dict[str, Any] = await resp.json()
    return command


async def outputs_until_exit(
    client: Client, auth: dict[str, str], command_id: str, timeout: float = 20
) -> list[dict[str, Any]]:
    """Poll as RemoteWorkspace does: BashOutput only, order__gt the last order seen."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            params: dict[str, str] = {"command_id__eq": command_id, "kind__eq": "BashOutput"}
            if seen:
                params["order__gt"] = str(seen[-1]["order"])
            resp = await client.get(SEARCH, params=params, headers=auth)
            assert resp.status == 200, await resp.text()
            seen.extend((await resp.json())["items"])
            if seen and seen[-1]["exit_code"] is not None:
                return seen
            await asyncio.sleep(0.05)


async def test_start_returns_the_command_and_outputs_arrive_in_order(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    command = await start(agent_client, auth, command="echo out; echo err >&2; exit 3")
    assert command["kind"] == "BashCommand"
    assert command["command"] == "echo out; echo err >&2; exit 3"
    assert command["cwd"] == str(workspace)
    assert command["timeout"] == 300  # the official default
    assert uuid.UUID(command["id"]).hex == command["id"]
    outputs = await outputs_until_exit(agent_client, auth, command["id"])
    assert [o["order"] for o in outputs] == list(range(len(outputs)))
    assert "".join(o["stdout"] or "" for o in outputs) == "out\n"
    assert "".join(o["stderr"] or "" for o in outputs) == "err\n"
    assert outputs[-1]["exit_code"] == 3
    assert all(o["command_id"] == command["id"] for o in outputs)

    # The command and its outputs, by id and in the unfiltered listing; dashed ids work too.
    resp = await agent_client.get(f"/api/bash/bash_events/{command['id']}", headers=auth)
    assert (await resp.json()) == command
    resp = await agent_client.get(
        SEARCH, params={"command_id__eq": str(uuid.UUID(command["id"]))}, headers=auth
    )
    listed = (await resp.json())["items"]
    assert listed[0] == command
    assert listed[1:] == outputs
    resp = await agent_client.get(
        "/api/bash/bash_events/",
        params=[("event_ids", outputs[-1]["id"]), ("event_ids", "f" * 32)],
        headers=auth,
    )
    assert await resp.json() == [outputs[-1], None]


async def test_long_output_is_streamed_while_the_command_runs(
    agent_client: Client, auth: dict[str, str]
) -> None:
    command = await start(agent_client, auth, command="echo first; sleep 1.5; echo second")
    began = time.monotonic()
    async with asyncio.timeout(10):
        while True:  # the first line shows up before the command ends
            resp = await agent_client.get(
                SEARCH, params={"command_id__eq": command["id"]}, headers=auth
            )
            items = [i for i in (await resp.json())["items"] if i["kind"] == "BashOutput"]
            if items:
                break
            await asyncio.sleep(0.05)
    assert time.monotonic() - began < 1.4
    assert items[0]["stdout"] == "first\n"
    assert items[0]["exit_code"] is None
    outputs = await outputs_until_exit(agent_client, auth, command["id"])
    assert "".join(o["stdout"] or "" for o in outputs) == "first\nsecond\n"
    assert outputs[-1]["exit_code"] == 0


async def test_timeout_ends_with_exit_code_minus_one(
    agent_client: Client, auth: dict[str, str]
) -> None:
    command = await start(agent_client, auth, command="echo started; sleep 60", timeout=1)
    outputs = await outputs_until_exit(agent_client, auth, command["id"])
    assert outputs[-1]["exit_code"] == -1
    assert "".join(o["stdout"] or "" for o in outputs) == "started\n"


async def test_stop_a_running_command(agent_client: Client, auth: dict[str, str]) -> None:
    command = await start(agent_client, auth, command="sleep 60")
    stop = f"/api/bash/bash_commands/{command['id']}/stop"
    resp = await agent_client.post(stop, headers=auth)
    assert await resp.json() == {"success": True}
    outputs = await outputs_until_exit(agent_client, auth, command["id"], timeout=10)
    assert outputs[-1]["exit_code"] == 128 + 9  # SIGKILL, as a shell reports it
    resp = await agent_client.post(stop, headers=auth)
    assert resp.status == 200  # already finished: still a success
    resp = await agent_client.post(f"/api/bash/bash_commands/{'0' * 32}/stop", headers=auth)
    assert resp.status == 404


async def test_filters_validation_and_clear(agent_client: Client, auth: dict[str, str]) -> None:
    first = await start(agent_client, auth, command="echo one")
    second = await start(agent_client, auth, command="echo two", cwd="/tmp")
    for command in (first, second):
        await outputs_until_exit(agent_client, auth, command["id"])
    resp = await agent_client.get(SEARCH, params={"kind__eq": "BashCommand"}, headers=auth)
    assert [c["id"] for c in (await resp.json())["items"]] == [first["id"], second["id"]]
    resp = await agent_client.get(
        SEARCH, params={"kind__eq": "BashCommand", "sort_order": "TIMESTAMP_DESC"}, headers=auth
    )
    assert [c["id"] for c in (await resp.json())["items"]] == [second["id"], first["id"]]
    resp = await agent_client.get(SEARCH, params={"limit": "1"}, headers=auth)
    page = await resp.json()
    assert len(page["items"]) == 1
    assert page["next_page_id"] is not None
    resp = await agent_client.get(
        SEARCH,
        params={"timestamp__gte": second["timestamp"], "kind__eq": "BashCommand"},
        headers=auth,
    )
    assert [c["id"] for c in (await resp.json())["items"]] == [second["id"]]

    for params in (
        {"kind__eq": "Other"},
        {"command_id__eq": "nope"},
        {"order__gt": "x"},
        {"limit": "101"},
        {"timestamp__gte": "yesterday"},
    ):
        resp = await agent_client.get(SEARCH, params=params, headers=auth)
        assert resp.status == 422, params
        assert (await resp.json())["detail"][0]["loc"][0] == "query"
    for body in ({"command": "true", "timeout": 0}, {"command": "true", "shell": "zsh"}, {}):
        resp = await agent_client.post(START, json=body, headers=auth)
        assert resp.status == 422, body
    resp = await agent_client.post(
        START, json={"command": "true", "cwd": "/nonexistent"}, headers=auth
    )
    assert resp.status == 400

    resp = await agent_client.delete("/api/bash/bash_events", headers=auth)
    assert (await resp.json())["cleared_count"] >= 4
    resp = await agent_client.get(SEARCH, headers=auth)
    assert (await resp.json())["items"] == []


def test_utf8_split_across_chunks_is_kept_whole() -> None:
    stream = _Stream(limit=1024)
    data = "héllo ✓".encode()
    stream.feed(data[:2])  # "h" and the first byte of "é"
    assert stream.take() == "h"
    stream.feed(data[2:])
    assert stream.take() == "éllo ✓"
    stream = _Stream(limit=3)
    stream.feed(b"abcdef")
    assert stream.truncated
    assert stream.rest() == "abc"


async def test_old_commands_are_forgotten(
    agent_client: Client, auth: dict[str, str], monkeypatch: Any
) -> None:
    monkeypatch.setattr(agent.bash, "MAX_COMMANDS", 3)
    ids = []
    for n in range(5):
        command = await start(agent_client, auth, command=f"echo {n}")
        await outputs_until_exit(agent_client, auth, command["id"])
        ids.append(command["id"])
    resp = await agent_client.get(SEARCH, params={"kind__eq": "BashCommand"}, headers=auth)
    assert [c["id"] for c in (await resp.json())["items"]] == ids[-3:]
