"""A conversation's checkpoints with our agent in a real sandbox, a real registry and a scripted
LLM: one at each user message, rewind (workspace and the agent's state back, later events kept
and marked) and fork (a new conversation in its own sandbox, whose agent goes on from the
source's stored conversation at the checkpoint)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    events_of,
    message,
    start_and_wait,
    wait_conversation,
    wait_events,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.live_server import Api
from tests.support.sandbox_helpers import OwnDocker

pytestmark = [
    pytest.mark.usefixtures("sandbox_images", "base_images"),
    pytest.mark.live_config("snapshot_settings"),
]
STATE = "/var/lib/acs-agent/conversations"
LEASE = f"for d in {STATE}/*/; do echo held > $d/owner_lease.json; done"
LOADED = 180  # seconds: a boot or a turn on a 2-core host other suites load too
AFTER_REWIND = (
    'cd /workspace && m="$(stat -c %y a.txt)" && printf "ONE\\n" > a.txt && touch -d "$m" a.txt'
)


def finished_turns(events: list[dict[str, Any]]) -> int:
    return sum(
        1
        for e in events
        if e["kind"] == "ConversationStateUpdateEvent"
        and e.get("key") == "execution_status"
        and e.get("value") == "finished"
        and "rewound_by" not in e
    )


async def wait_turns(api: Api, cid: str, turns: int) -> list[dict[str, Any]]:
    await wait_events(api, cid, lambda ev: finished_turns(ev) >= turns, within=LOADED)
    await asyncio.sleep(0.5)  # the turn's last events (its stats) land
    return await events_of(api, cid)


async def checkpoints_of(api: Api, cid: str, within: float = 30) -> list[dict[str, Any]]:
    """The conversation's checkpoints once every one being stored is listed (their snapshots
    are sent in the background)."""
    deadline = time.monotonic() + within
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        page = await api.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints")
        if page["items"] and page["items"] == seen:
            return seen
        seen = page["items"]
        await asyncio.sleep(0.5)
    return seen


def read(own_docker: OwnDocker, sandbox_id: str, command: str) -> str:
    result = own_docker.container(sandbox_id).exec_run(["bash", "-c", command])
    return str(result.output.decode().strip())


async def two_turns(user: UserFactory, fake_llm: FakeLLM) -> tuple[Api, str, str, list[Any]]:
    """Alice's conversation: turn 1 writes a.txt "one"; turn 2 (a message, so a checkpoint
    before it) overwrites it and writes b.txt. Her api, the conversation, its sandbox, and the
    events as they were before message 2."""
    fake_llm.script(
        [
            # The official server's lease mark (its owner's, which a rewind must not restore).
            reply_tool_call("terminal", {"command": f"echo one > /workspace/a.txt; {LEASE}"}),
            reply_finish("wrote one"),
            reply_tool_call(
                "terminal", {"command": "echo two > /workspace/a.txt; echo b > /workspace/b.txt"}
            ),
            reply_finish("wrote two"),
        ]
    )
    alice = await user("alice")
    task = await start_and_wait(alice, within=LOADED, initial_message=message("FIRST write one"))
    assert task["status"] == "READY", task
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    before = await wait_turns(alice, cid, 1)
    await alice.ok(
        "POST", f"/api/v1/app-conversations/{cid}/events", json=message("SECOND write two")
    )
    await wait_turns(alice, cid, 2)
    return alice, cid, sandbox_id, before


async def test_rewind_brings_files_and_agent_state_back_and_marks_later_events(
    user: UserFactory, fake_llm: FakeLLM, own_docker: OwnDocker
) -> None:
    alice, cid, sandbox_id, before = await two_turns(user, fake_llm)
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt /workspace/b.txt") == "two\nb"

    (checkpoint,) = await checkpoints_of(alice, cid)
    assert checkpoint["conversation_id"] == cid
    assert checkpoint["sandbox_id"] == sandbox_id
    assert checkpoint["event_id"] == before[-1]["id"]  # the point: before message 2
    snapshot = await alice.ok("GET", f"/api/v1/snapshots/{checkpoint['snapshot_id']}")
    assert snapshot["sandbox_id"] == sandbox_id
    session_key = (await alice.ok("GET", f"/api/v1/app-conversations/{cid}"))["session_api_key"]

    rewound = await alice.ok(
        "POST",
        f"/api/v1/app-conversations/{cid}/rewind",
        json={"checkpoint_id": checkpoint["id"]},
    )
    all_before = await events_of(alice, cid)
    assert rewound["sandbox_id"] == sandbox_id
    assert rewound["sandbox_status"] == "STARTING"
    assert rewound["rewound_events"] == len(all_before) - len(before) > 0
    conversation = await wait_conversation(alice, cid, "sandbox_status", "RUNNING", within=LOADED)
    assert conversation["session_api_key"] == session_key  # the same sandbox, ids and key

    # The workspace as it was before message 2; the agent's state too.
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt") == "one"
    assert read(own_docker, sandbox_id, "test -e /workspace/b.txt || echo absent") == "absent"
    assert read(own_docker, sandbox_id, f"ls {STATE}") == cid
    kept = read(own_docker, sandbox_id, f"ls -A {STATE}/{cid}").split()
    assert kept
    assert "owner_lease.json" not in kept  # its owner is gone with the old instance
    # Changed right after the rewind, at the same size, its mtime set back: the next checkpoint
    # (whose export knows the rewound files' signatures) must read it again.
    read(own_docker, sandbox_id, AFTER_REWIND)

    # Kept, and marked: every event after the checkpoint's, none before.
    events = await events_of(alice, cid)
    assert [e["id"] for e in events] == [e["id"] for e in all_before]
    point = [e["id"] for e in events].index(checkpoint["event_id"])
    assert all("rewound_by" not in e for e in events[: point + 1])
    assert all(e["rewound_by"] == checkpoint["id"] for e in events[point + 1 :])
    second = [e for e in events if e["kind"] == "MessageEvent" and "SECOND" in json.dumps(e)]
    assert second
    assert all(e["rewound_by"] == checkpoint["id"] for e in second)
    (one,) = await alice.ok("GET", f"/api/v1/events?id={second[0]['id']}")
    assert one["rewound_by"] == checkpoint["id"]

    # The agent goes on from there: the model sees turn 1, not turn 2.
    fake_llm.script([reply_text("THIRD seen"), reply_finish("ok")])
    asked = len(fake_llm.requests)
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("THIRD"))
    await fake_llm.wait_for_requests(asked + 1, timeout=LOADED)
    sent = json.dumps(fake_llm.requests[asked].body["messages"])
    assert "FIRST write one" in sent
    assert "THIRD" in sent
    assert "SECOND write two" not in sent
    assert "wrote two" not in sent
    await wait_turns(alice, cid, 2)

    # A checkpoint of the rewound sandbox holds its state too (read from the base it was made
    # from and what changed since): rewound to it, the agent has turn 1 and not turn 3.
    newest, older = await checkpoints_of(alice, cid)
    assert older["id"] == checkpoint["id"]
    await alice.ok(
        "POST", f"/api/v1/app-conversations/{cid}/rewind", json={"checkpoint_id": newest["id"]}
    )
    await wait_conversation(alice, cid, "sandbox_status", "RUNNING", within=LOADED)
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt") == "ONE"
    fake_llm.script([reply_text("FOURTH seen"), reply_finish("ok")])
    asked = len(fake_llm.requests)
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("FOURTH"))
    await fake_llm.wait_for_requests(asked + 1, timeout=LOADED)
    sent = json.dumps(fake_llm.requests[asked].body["messages"])
    assert "FIRST write one" in sent
    assert "FOURTH" in sent
    assert "THIRD" not in sent
    assert "SECOND write two" not in sent


async def test_fork_starts_a_new_conversation_in_its_own_sandbox(
    user: UserFactory, fake_llm: FakeLLM, own_docker: OwnDocker
) -> None:
    alice, cid, sandbox_id, before = await two_turns(user, fake_llm)
    (checkpoint,) = await checkpoints_of(alice, cid)
    source = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")

    forked = await alice.ok(
        "POST",
        f"/api/v1/app-conversations/{cid}/fork",
        json={"checkpoint_id": checkpoint["id"], "title": "the other way"},
    )
    fork_id, fork_sandbox = forked["conversation_id"], forked["sandbox_id"]
    assert fork_id != cid
    assert fork_sandbox != sandbox_id
    assert forked["copied_events"] == len(before)
    deadline = time.monotonic() + LOADED
    task = forked["start_task"]
    while task["status"] not in ("READY", "ERROR") and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        (task,) = await alice.ok(
            "GET", f"/api/v1/app-conversations/start-tasks?ids={forked['start_task']['id']}"
        )
    assert task["status"] == "READY", task
    fork = await wait_conversation(alice, fork_id, "sandbox_status", "RUNNING", within=LOADED)
    assert fork["title"] == "the other way"
    assert fork["sandbox_id"] == fork_sandbox

    # Its files are the checkpoint's; nothing of the source's agent state or secrets.
    assert read(own_docker, fork_sandbox, "cat /workspace/a.txt") == "one"
    assert read(own_docker, fork_sandbox, "test -e /workspace/b.txt || echo absent") == "absent"
    assert read(own_docker, fork_sandbox, f"ls {STATE}") == fork_id
    assert fork["session_api_key"] not in (None, source["session_api_key"])
    tokens = read(own_docker, fork_sandbox, f"grep -rho 'acsgw[.][^\"]*' {STATE} | sort -u")
    assert f".{fork_sandbox}." in tokens
    assert sandbox_id not in tokens
    # The history up to the checkpoint, the same events; the source unchanged.
    history = await events_of(alice, fork_id)
    assert [e["id"] for e in history[: len(before)]] == [e["id"] for e in before]
    assert all("rewound_by" not in e for e in await events_of(alice, cid))
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt") == "two"

    # The fork's agent works in its own sandbox, going on from the source's turns before the
    # checkpoint (its stored conversation carried under the fork's id), not those after.
    fake_llm.script(
        [reply_tool_call("terminal", {"command": "echo fork > /workspace/c.txt"}), reply_finish()]
    )
    asked = len(fake_llm.requests)
    await alice.ok(
        "POST", f"/api/v1/app-conversations/{fork_id}/events", json=message("in the fork")
    )
    await wait_turns(alice, fork_id, 2)  # the copied history holds turn 1
    sent = json.dumps(fake_llm.requests[asked].body["messages"])
    assert "FIRST write one" in sent
    assert "wrote one" in sent
    assert "in the fork" in sent
    assert "SECOND write two" not in sent
    assert read(own_docker, fork_sandbox, "cat /workspace/c.txt") == "fork"
    carried = read(own_docker, fork_sandbox, f"ls -A {STATE}/{fork_id}").split()
    assert {"events.jsonl", "history.jsonl", "meta.json"} <= set(carried)
    assert "owner_lease.json" not in carried
    assert read(own_docker, sandbox_id, "test -e /workspace/c.txt || echo absent") == "absent"
