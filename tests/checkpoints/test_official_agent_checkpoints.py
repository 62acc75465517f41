"""A rewind with the official OpenHands agent server (acs-sandbox-openhands): it restores its
conversation from the state on disk that the checkpoint brought back (its secrets sealed with
the sandbox's session key, which a rewind keeps), and goes on from the checkpoint. The
checkpoint holds the old server's lease on the conversation, which a rewind must not restore:
the rebuilt server would answer the next message 404 "Conversation not found" until it expired
(45 s after the checkpoint). A fork at the checkpoint carries the stored conversation's events
(not its sealed state) into a new sandbox, whose server goes on from them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.checkpoints.test_checkpoints import checkpoints_of, read
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
    pytest.mark.slow,
    pytest.mark.official_agent,
    pytest.mark.timeout(1800),  # two boots of the official server, slow on a loaded host
    pytest.mark.usefixtures("sandbox_images", "openhands_image", "base_images"),
    pytest.mark.live_config("snapshot_settings", enable_specs=["openhands"], start_timeout=600),
]
MODEL = "openai/fake-model"
STATE = "/var/lib/acs-agent/conversations"


def finished_after(text: str) -> Callable[[list[dict[str, Any]]], bool]:
    """The agent finished a turn after the user's message holding `text`."""

    def check(events: list[dict[str, Any]]) -> bool:
        sent = [
            n
            for n, e in enumerate(events)
            if e["kind"] == "MessageEvent" and e["source"] == "user" and text in json.dumps(e)
        ]
        return bool(sent) and any(
            e["kind"] == "ConversationStateUpdateEvent"
            and e.get("key") == "execution_status"
            and e.get("value") == "finished"
            for e in events[sent[-1] :]
        )

    return check


async def turn(api: Api, cid: str, text: str) -> list[dict[str, Any]]:
    await api.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message(text))
    return await wait_events(api, cid, finished_after(text), within=300)


async def context_of_turn(api: Api, fake_llm: FakeLLM, cid: str, text: str) -> str:
    """The messages the model was sent (JSON) at a turn of `text`, answered with a finish."""
    fake_llm.script([reply_text(f"{text} seen"), reply_finish("ok")])
    asked = len(fake_llm.requests)
    await turn(api, cid, text)
    tooled = [r for r in fake_llm.requests[asked:] if r.body.get("tools")]
    assert tooled, [r.body for r in fake_llm.requests[asked:]]
    return json.dumps(tooled[0].body["messages"])


async def test_official_agent_rewinds_to_its_state_on_disk(
    user: UserFactory, fake_llm: FakeLLM, own_docker: OwnDocker
) -> None:
    fake_llm.untooled = reply_finish("(untooled)")
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo one > /workspace/a.txt"}),
            reply_finish("wrote one"),
            reply_tool_call("terminal", {"command": "echo two > /workspace/a.txt"}),
            reply_finish("wrote two"),
        ]
    )
    alice = await user("alice", llm_model=MODEL, sandbox_spec_id="openhands")
    task = await start_and_wait(alice, within=300, initial_message=message("FIRST write one"))
    assert task["status"] == "READY", task
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    await wait_events(alice, cid, finished_after("FIRST"), within=300)
    await turn(alice, cid, "SECOND write two")
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt") == "two"
    (checkpoint,) = await checkpoints_of(alice, cid)

    rewound = await alice.ok(
        "POST",
        f"/api/v1/app-conversations/{cid}/rewind",
        json={"checkpoint_id": checkpoint["id"]},
    )
    assert rewound["rewound_events"] > 0
    try:
        await wait_conversation(alice, cid, "sandbox_status", "RUNNING", within=620)
    except AssertionError as exc:  # what the restored server said
        logs = own_docker.container(sandbox_id).logs(tail=60).decode(errors="replace")
        raise AssertionError(f"{exc}\n--- the sandbox's log:\n{logs}") from None
    # No lease of the old server came back: one there now is the rebuilt server's own.
    lease = read(own_docker, sandbox_id, f"cat {STATE}/*/owner_lease.json 2>/dev/null || true")
    host = read(own_docker, sandbox_id, "cat /etc/hostname")
    assert not lease or json.loads(lease)["owner_host"] == host, (lease, host)
    assert read(own_docker, sandbox_id, "cat /workspace/a.txt") == "one"
    events = await events_of(alice, cid)
    second = [e for e in events if e["kind"] == "MessageEvent" and "SECOND" in json.dumps(e)]
    assert second
    assert all(e["rewound_by"] == checkpoint["id"] for e in second)

    # The restored server goes on from its conversation as it was: turn 1, not turn 2.
    sent = await context_of_turn(alice, fake_llm, cid, "THIRD")
    assert "FIRST write one" in sent
    assert "THIRD" in sent
    assert "SECOND write two" not in sent

    # A fork at the same checkpoint: a new sandbox whose server goes on from the source's
    # events there (carried under the new id), without the source's credentials.
    forked = await alice.ok(
        "POST",
        f"/api/v1/app-conversations/{cid}/fork",
        json={"checkpoint_id": checkpoint["id"]},
    )
    fork_id, fork_sandbox = forked["conversation_id"], forked["sandbox_id"]
    task, deadline = forked["start_task"], time.monotonic() + 600
    while task["status"] not in ("READY", "ERROR") and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        (task,) = await alice.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}")
    assert task["status"] == "READY", task
    assert read(own_docker, fork_sandbox, "cat /workspace/a.txt") == "one"
    tokens = read(own_docker, fork_sandbox, f"grep -rho 'acsgw[.][^\"]*' {STATE} | sort -u")
    assert sandbox_id not in tokens
    sent = await context_of_turn(alice, fake_llm, fork_id, "IN THE FORK")
    assert "FIRST write one" in sent
    assert "IN THE FORK" in sent
    assert "SECOND write two" not in sent
    assert "THIRD" not in sent
