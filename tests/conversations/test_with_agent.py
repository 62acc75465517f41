"""End to end through the control plane: a real agent in a real sandbox, a scripted fake LLM."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.conversation_helpers import (
    LLM_KEY,
    UserFactory,
    events_of,
    message,
    of_kind,
    start_and_wait,
    wait_conversation,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.log_capture import capture_logs
from tests.support.sandbox_helpers import OwnDocker

pytestmark = pytest.mark.usefixtures("sandbox_images")


def stats_updates(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["value"]
        for e in events
        if e["kind"] == "ConversationStateUpdateEvent" and e.get("key") == "stats"
    ]


def exec_in(own_docker: OwnDocker, command: str) -> str:
    """`command` run by bash in the test's one sandbox container."""
    (container,) = own_docker.containers()
    result = container.exec_run(["bash", "-c", command])
    return str(result.output.decode().strip())


async def test_command_writes_a_file_and_events_show_it(
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo hello > /workspace/out.txt"}),
            reply_finish("wrote it"),
        ]
    )
    with capture_logs("debug") as logs:
        alice = await user("alice")
        task = await start_and_wait(alice, initial_message=message("write hello to out.txt"))
        assert task["status"] == "READY", task
        cid = task["app_conversation_id"]
        events = await wait_finished(alice, cid)
        conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")

    assert exec_in(own_docker, "cat /workspace/out.txt") == "hello"
    (action,) = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "terminal"]
    assert action["action"]["kind"] == "TerminalAction"
    assert action["action"]["command"] == "echo hello > /workspace/out.txt"
    (observation,) = [
        o for o in of_kind(events, "ObservationEvent") if o["action_id"] == action["id"]
    ]
    assert observation["observation"]["exit_code"] == 0
    assert of_kind(events, "MessageEvent")[0]["source"] == "user"

    assert conversation["sandbox_status"] == "RUNNING"
    assert conversation["execution_status"] == "finished"
    assert conversation["conversation_url"].endswith(f"/api/conversations/{cid}")
    assert conversation["session_api_key"]
    assert conversation["sandbox_id"] == task["sandbox_id"]

    # The key reached the model server, and nowhere else.
    assert fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"
    assert LLM_KEY not in json.dumps(events)
    assert LLM_KEY not in json.dumps(conversation) + json.dumps(task)
    assert LLM_KEY not in logs.text
    settings = await alice.ok("GET", "/api/settings")
    assert LLM_KEY not in json.dumps(settings)
    (container,) = own_docker.containers()
    assert not any(LLM_KEY in env for env in container.attrs["Config"]["Env"])


async def test_file_edit_and_tool_error(
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.script(
        [
            reply_tool_call(
                "file_editor",
                {"command": "create", "path": "/workspace/a.txt", "file_text": "one two\n"},
            ),
            reply_tool_call(
                "file_editor",
                {
                    "command": "str_replace",
                    "path": "/workspace/a.txt",
                    "old_str": "two",
                    "new_str": "three",
                },
            ),
            reply_tool_call(
                "file_editor",
                {
                    "command": "str_replace",
                    "path": "/workspace/a.txt",
                    "old_str": "missing",
                    "new_str": "x",
                },
            ),
            reply_tool_call("no_such_tool", {}),
            reply_finish(),
        ]
    )
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("edit a.txt"))
    cid = task["app_conversation_id"]
    events = await wait_finished(alice, cid)
    assert exec_in(own_docker, "cat /workspace/a.txt") == "one three"
    failures = [
        o for o in of_kind(events, "ObservationEvent") if o["observation"]["is_error"]
    ] + of_kind(events, "AgentErrorEvent")
    texts = json.dumps(failures)
    assert "missing" in texts, texts
    assert "no_such_tool" in texts, texts


async def test_max_iterations_stops_a_looping_model(user: UserFactory, fake_llm: FakeLLM) -> None:
    fake_llm.when_exhausted = reply_tool_call("terminal", {"command": "true"})
    alice = await user("alice", max_iterations=3)
    task = await start_and_wait(alice, initial_message=message("loop"))
    events = await wait_events(
        alice, task["app_conversation_id"], lambda ev: bool(of_kind(ev, "ConversationErrorEvent"))
    )
    (error,) = of_kind(events, "ConversationErrorEvent")
    assert error["code"] == "MaxIterationsReached"
    assert len(stats_updates(events)) == 3
    assert len(fake_llm.requests) == 3


async def test_budget_stops_the_agent(user: UserFactory, fake_llm: FakeLLM) -> None:
    # 100 prompt + 20 completion tokens at (0.001, 0.002) USD = 0.14 per call.
    fake_llm.when_exhausted = reply_tool_call("terminal", {"command": "true"})
    alice = await user("alice", max_budget_per_task=0.3)
    task = await start_and_wait(alice, initial_message=message("spend"))
    cid = task["app_conversation_id"]
    events = await wait_events(alice, cid, lambda ev: bool(of_kind(ev, "ConversationErrorEvent")))
    (error,) = of_kind(events, "ConversationErrorEvent")
    assert error["code"] == "BudgetExceeded"
    costs = [u["usage_to_metrics"]["agent"]["accumulated_cost"] for u in stats_updates(events)]
    assert costs == pytest.approx([0.14, 0.28, 0.42])
    conversation = await wait_conversation(alice, cid, "execution_status", "error")
    assert conversation["metrics"]["accumulated_cost"] == pytest.approx(0.42)  # from the stats
    assert conversation["metrics"]["max_budget_per_task"] == pytest.approx(0.3)
    tokens = conversation["metrics"]["accumulated_token_usage"]
    assert (tokens["prompt_tokens"], tokens["completion_tokens"]) == (300, 60)


async def test_confirmation_mode_approve_and_reject(
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo a > /workspace/c1.txt"}),
            reply_tool_call("terminal", {"command": "echo b > /workspace/c2.txt"}),
            reply_finish(),
        ]
    )
    alice = await user("alice", confirmation_mode=True)
    task = await start_and_wait(alice, initial_message=message("two commands"))
    cid = task["app_conversation_id"]
    path = f"/api/v1/app-conversations/{cid}/respond_to_confirmation"

    await wait_conversation(alice, cid, "execution_status", "waiting_for_confirmation")
    assert exec_in(own_docker, "ls /workspace") == ""
    await alice.ok("POST", path, json={"accept": True})
    await wait_events(alice, cid, lambda ev: len(of_kind(ev, "ObservationEvent")) == 1)
    assert exec_in(own_docker, "cat /workspace/c1.txt") == "a"

    await wait_conversation(alice, cid, "execution_status", "waiting_for_confirmation")
    await alice.ok("POST", path, json={"accept": False, "reason": "not that one"})
    await wait_events(alice, cid, lambda ev: bool(of_kind(ev, "UserRejectObservation")))
    # finish is an action too: it waits for approval like any other.
    await wait_conversation(alice, cid, "execution_status", "waiting_for_confirmation")
    await alice.ok("POST", path, json={"accept": True})
    events = await wait_finished(alice, cid)
    (rejected,) = of_kind(events, "UserRejectObservation")
    assert rejected["rejection_reason"] == "not that one"
    assert exec_in(own_docker, "ls /workspace/c2.txt 2>&1 || true").endswith(
        "No such file or directory"
    )


MCP_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("calc")
@server.tool()
def add(a: int, b: int) -> int:
    return a + b
server.run()
"""


async def test_mcp_stdio_server_tool_is_called(user: UserFactory, fake_llm: FakeLLM) -> None:
    fake_llm.script([reply_tool_call("calc__add", {"a": 2, "b": 3}), reply_finish()])
    mcp: dict[str, Any] = {
        "stdio_servers": [
            {"name": "calc", "command": "/opt/agent/bin/python", "args": ["-c", MCP_SERVER]}
        ]
    }
    alice = await user("alice", mcp_config=mcp)
    task = await start_and_wait(alice, initial_message=message("add 2 and 3"))
    cid = task["app_conversation_id"]
    events = await wait_finished(alice, cid)
    (action,) = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "calc__add"]
    (observation,) = [
        o for o in of_kind(events, "ObservationEvent") if o["action_id"] == action["id"]
    ]
    assert "5" in json.dumps(observation["observation"])
    offered = {t["function"]["name"] for t in fake_llm.requests[0].body["tools"]}
    assert {"terminal", "file_editor", "finish", "think", "calc__add"} <= offered


async def test_pause_sandbox_mid_conversation_then_go_on(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_text("first answer"), reply_text("second answer")])
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("first question"))
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    await wait_events(
        alice,
        cid,
        lambda ev: any(e["kind"] == "MessageEvent" and e["source"] == "agent" for e in ev),
    )

    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
    paused = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert paused["sandbox_status"] == "PAUSED"
    history = await events_of(alice, cid)  # readable while the sandbox is frozen
    assert of_kind(history, "MessageEvent")

    await alice.ok(
        "POST", f"/api/v1/app-conversations/{cid}/events", json=message("second question")
    )
    events = await wait_events(
        alice,
        cid,
        lambda ev: any(
            e["kind"] == "MessageEvent" and "second answer" in json.dumps(e) for e in ev
        ),
    )
    texts = [json.dumps(e["llm_message"]) for e in of_kind(events, "MessageEvent")]
    assert [
        "first question" in texts[0],
        "first answer" in texts[1],
        "second question" in texts[2],
    ] == [True, True, True]
    sent = json.dumps(fake_llm.requests[-1].body["messages"])
    assert "first question" in sent
    assert "first answer" in sent
    assert "second question" in sent
    resumed = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert resumed["sandbox_status"] == "RUNNING"
