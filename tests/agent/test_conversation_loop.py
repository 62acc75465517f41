"""The agent loop against the fake LLM: tools, errors, stop conditions."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.agent.conv_helpers import (
    BASE,
    LLM_KEY,
    events,
    of_kind,
    start,
    statuses,
    stop_reasons,
    user_message,
    wait_status,
)
from tests.support.fake_llm import (
    FakeLLM,
    reply_finish,
    reply_text,
    reply_tool_call,
    reply_tool_calls,
    tool_call,
)
from tests.support.types import Client


async def test_bash_run_writes_a_file_and_finishes(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    local_fake_llm.script(
        [
            reply_tool_call(
                "terminal", {"command": "echo hi > f.txt && cat f.txt"}, thought="Writing."
            ),
            reply_finish("File written."),
        ]
    )
    created = await start(agent_client, auth, local_fake_llm, "Write hi to f.txt")
    cid = created["id"]
    assert str(uuid.UUID(cid)) == cid  # as the official server writes it
    done = await wait_status(agent_client, auth, cid)
    assert done["execution_status"] == done["status"] == "finished"
    assert (workspace / "f.txt").read_text() == "hi\n"

    items = await events(agent_client, auth, cid)
    assert items[0]["kind"] == "SystemPromptEvent"
    assert [t["kind"] for t in items[0]["tools"]] == [
        "TerminalTool",
        "FileEditorTool",
        "FinishTool",
        "ThinkTool",
    ]
    assert [e["source"] for e in of_kind(items, "MessageEvent")] == ["user"]
    action = of_kind(items, "ActionEvent")[0]
    assert action["tool_name"] == "terminal"
    assert action["action"] == {
        "kind": "TerminalAction",
        "command": "echo hi > f.txt && cat f.txt",
        "is_input": False,
        "reset": False,
    }
    assert action["thought"] == [{"type": "text", "text": "Writing."}]
    assert action["llm_response_id"] == "chatcmpl-fake-1"
    assert action["tool_call"]["name"] == "terminal"
    assert json.loads(action["tool_call"]["arguments"]) == {
        "command": "echo hi > f.txt && cat f.txt"
    }
    observation = of_kind(items, "ObservationEvent")[0]
    assert observation["action_id"] == action["id"]
    assert observation["tool_call_id"] == action["tool_call_id"]
    assert observation["observation"]["kind"] == "TerminalObservation"
    assert observation["observation"]["exit_code"] == 0
    assert observation["observation"]["metadata"]["working_dir"] == str(workspace)
    assert observation["observation"]["content"] == [{"type": "text", "text": "hi"}]
    finish = of_kind(items, "ObservationEvent")[1]["observation"]
    assert finish == {
        "kind": "FinishObservation",
        "content": [{"type": "text", "text": "File written."}],
        "is_error": False,
    }
    assert statuses(items) == ["running", "finished"]
    assert stop_reasons(items) == ["finished"]
    for event in items:
        assert set(event) >= {"id", "timestamp", "source", "kind"}
        # As the SDK writes them: naive ISO 8601 (UTC here).
        assert datetime.fromisoformat(event["timestamp"]).tzinfo is None

    # What the model was sent: tools, the key, then the tool result in the second call.
    first, second = local_fake_llm.requests[0], local_fake_llm.requests[1]
    assert first.authorization == f"Bearer {LLM_KEY}"
    assert first.body["model"] == "fake-model"
    assert first.body["tool_choice"] == "auto"
    names = {t["function"]["name"] for t in first.body["tools"]}
    assert names == {"terminal", "file_editor", "finish", "think"}
    assert first.body["messages"][0]["role"] == "system"
    assert str(workspace) in first.body["messages"][0]["content"]
    assert first.body["messages"][1] == {"role": "user", "content": "Write hi to f.txt"}
    tool_result = second.body["messages"][-1]
    assert tool_result["role"] == "tool"
    assert tool_result["tool_call_id"] == action["tool_call_id"]
    assert "exit code 0" in tool_result["content"]

    assert done["iterations"] == 2
    usage = done["stats"]["usage_to_metrics"]["agent"]["accumulated_token_usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (200, 40)
    assert done["metrics"]["accumulated_token_usage"] == usage
    stats_updates = [
        e for e in items if e["kind"] == "ConversationStateUpdateEvent" and e["key"] == "stats"
    ]
    assert len(stats_updates) == 2
    assert stats_updates[-1]["value"] == done["stats"]


async def test_text_reply_finishes_the_run_and_a_new_message_resumes(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("Which file?"), reply_finish("ok")])
    cid = (await start(agent_client, auth, local_fake_llm, "Edit the file"))["id"]
    # As the SDK's agent: a text reply ends the run (RemoteConversation.run() returns).
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    resp = await agent_client.post(f"{BASE}/{cid}/events", json=user_message("a.txt"), headers=auth)
    assert resp.status == 200
    assert await resp.json() == {"success": True}
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    items = await events(agent_client, auth, cid)
    messages = of_kind(items, "MessageEvent")
    assert [(m["source"], m["llm_message"]["content"][0]["text"]) for m in messages] == [
        ("user", "Edit the file"),
        ("agent", "Which file?"),
        ("user", "a.txt"),
    ]
    assert statuses(items) == ["running", "finished", "idle", "running", "finished"]
    sent = local_fake_llm.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]


async def test_editor_create_replace_view_and_ambiguous_old_str(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    editor = "file_editor"
    local_fake_llm.script(
        [
            reply_tool_call(
                editor, {"command": "create", "path": "src/a.py", "file_text": "x = 1\nx = 1\n"}
            ),
            reply_tool_call(
                editor,
                {"command": "str_replace", "path": "src/a.py", "old_str": "x = 1", "new_str": "y"},
            ),
            reply_tool_call(
                editor,
                {
                    "command": "str_replace",
                    "path": str(workspace / "src/a.py"),
                    "old_str": "x = 1\nx = 1",
                    "new_str": "x = 2",
                },
            ),
            reply_tool_call(
                editor, {"command": "insert", "path": "src/a.py", "insert_line": 0, "new_str": "#"}
            ),
            reply_tool_call(editor, {"command": "view", "path": "src/a.py"}),
            reply_tool_call(editor, {"command": "view", "path": "missing.py"}),
            reply_tool_call(editor, {"command": "undo_edit", "path": "src/a.py"}),
            reply_finish(),
        ]
    )
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert (workspace / "src/a.py").read_text() == "x = 2\n"  # the insert was undone
    observations = [
        e["observation"] for e in of_kind(await events(agent_client, auth, cid), "ObservationEvent")
    ]

    def text(observation: dict[str, Any]) -> str:
        return "".join(part["text"] for part in observation["content"])

    assert {o["kind"] for o in observations[:-1]} == {"FileEditorObservation"}
    created = observations[0]
    assert "File created successfully" in text(created)
    assert (created["is_error"], created["prev_exist"]) == (False, False)
    assert created["new_content"] == "x = 1\nx = 1\n"
    assert created["path"] == str(workspace / "src/a.py")
    assert observations[1]["is_error"] is True
    assert "occurs 2 times" in text(observations[1])
    assert "lines 1, 2" in text(observations[1])
    assert "has been edited" in text(observations[2])
    assert observations[2]["old_content"] == "x = 1\nx = 1\n"
    assert observations[2]["new_content"] == "x = 2\n"
    assert "has been edited" in text(observations[3])
    assert "     1\t#\n     2\tx = 2" in text(observations[4])
    assert observations[5]["is_error"] is True
    assert "does not exist" in text(observations[5])
    assert "undone" in text(observations[6])
    assert observations[6]["new_content"] == "x = 2\n"
    # The model saw the error text as the tool result.
    assert "occurs 2 times" in local_fake_llm.requests[2].body["messages"][-1]["content"]


async def test_unknown_tool_and_bad_arguments_are_agent_errors_and_the_loop_goes_on(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script(
        [
            reply_tool_calls(
                tool_call("no_such_tool", {"x": 1}),
                tool_call("terminal", "{not json"),
                tool_call("terminal", {"timeout": 5}),
                tool_call("terminal", {"command": "echo ok"}),
            ),
            reply_finish(),
        ]
    )
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    items = await events(agent_client, auth, cid)
    errors = of_kind(items, "AgentErrorEvent")
    assert [e["tool_name"] for e in errors] == ["no_such_tool", "terminal", "terminal"]
    assert "unknown tool 'no_such_tool'" in errors[0]["error"]
    assert "not valid JSON" in errors[1]["error"]
    assert "command" in errors[2]["error"]
    assert len(of_kind(items, "ActionEvent")) == 2  # echo ok, finish
    assert of_kind(items, "ObservationEvent")[0]["observation"]["exit_code"] == 0
    tool_results = [m for m in local_fake_llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 4
    assert tool_results[0]["content"].startswith("Error: unknown tool")


async def test_max_iterations_stops_a_model_that_never_finishes(
    agent_client: Client, auth: dict[str, str]
) -> None:
    async with FakeLLM(when_exhausted="repeat") as fake:
        fake.script([reply_tool_call("terminal", {"command": "true"})])
        cid = (await start(agent_client, auth, fake, max_iterations=3))["id"]
        done = await wait_status(agent_client, auth, cid)
        assert done["execution_status"] == "error"
        assert done["iterations"] == 3
        assert len(fake.requests) == 3
        items = await events(agent_client, auth, cid)
        errors = of_kind(items, "ConversationErrorEvent")
        assert [e["code"] for e in errors] == ["MaxIterationsReached"]
        assert stop_reasons(items) == ["max_iterations"]
        assert items[-1]["kind"] == "ConversationStateUpdateEvent"
        assert items[-1]["value"] == "error"


async def test_budget_stops_the_agent(agent_client: Client, auth: dict[str, str]) -> None:
    async with FakeLLM(when_exhausted="repeat", prompt_tokens=1000, completion_tokens=100) as fake:
        fake.script([reply_tool_call("terminal", {"command": "true"})])
        llm = {"input_cost_per_token": 0.001, "output_cost_per_token": 0.002}  # $1.20 a call
        cid = (await start(agent_client, auth, fake, llm=llm, max_budget_per_task=3.0))["id"]
        done = await wait_status(agent_client, auth, cid)
        assert done["execution_status"] == "error"
        assert len(fake.requests) == 3  # 1.2, 2.4, 3.6 > 3.0
        assert abs(done["metrics"]["accumulated_cost"] - 3.6) < 1e-9
        assert done["metrics"]["max_budget_per_task"] == 3.0
        items = await events(agent_client, auth, cid)
        assert of_kind(items, "LLMCompletionLogEvent") == []  # log_completions is off
        stats = [
            e["value"]["usage_to_metrics"]["agent"]
            for e in items
            if e["kind"] == "ConversationStateUpdateEvent" and e["key"] == "stats"
        ]
        assert [round(s["accumulated_cost"], 6) for s in stats] == [1.2, 2.4, 3.6]
        assert stats[0]["accumulated_token_usage"]["prompt_tokens"] == 1000
        assert stats[0]["model_name"] == "fake-model"
        assert stats[0]["max_budget_per_task"] == 3.0
        assert [e["code"] for e in of_kind(items, "ConversationErrorEvent")] == ["BudgetExceeded"]
        assert stop_reasons(items) == ["budget"]
        assert len(of_kind(items, "ActionEvent")) == 2  # the reply past the budget is not run


async def test_message_sent_while_running_is_seen_at_the_next_call(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "true"}), reply_finish()])
    local_fake_llm.hold()
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    await local_fake_llm.wait_for_requests(1)
    resp = await agent_client.post(
        f"{BASE}/{cid}/events", json=user_message("also do X"), headers=auth
    )
    assert resp.status == 200
    local_fake_llm.release()
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    second = local_fake_llm.requests[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "user"]
    assert second[-1]["content"] == "also do X"
    assert json.loads(second[2]["tool_calls"][0]["function"]["arguments"]) == {"command": "true"}
