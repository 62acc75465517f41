"""Confirmation, pause/run, LLM retries and failures, and the conversation routes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent.conversations.masking import MASK
from tests.agent.conv_helpers import (
    BASE,
    LLM_KEY,
    events,
    info,
    llm_config,
    of_kind,
    start,
    statuses,
    stop_reasons,
    wait_status,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.types import Client, ClientFactory

CONFIRM = "/events/respond_to_confirmation"


async def test_confirmation_accept_runs_the_action(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "touch made"}), reply_finish()])
    cid = (await start(agent_client, auth, local_fake_llm, confirmation_mode=True))["id"]
    waiting = await wait_status(agent_client, auth, cid)
    assert waiting["execution_status"] == "waiting_for_confirmation"
    assert waiting["confirmation_mode"] is True
    action = of_kind(await events(agent_client, auth, cid), "ActionEvent")[0]
    assert waiting["pending_action_ids"] == [action["id"]]
    assert not (workspace / "made").exists()

    resp = await agent_client.post(f"{BASE}/{cid}/run", headers=auth)
    assert resp.status == 409  # the loop is alive, waiting
    resp = await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    assert resp.status == 200
    assert await resp.json() == {"success": True}
    # finish is an action too: it waits in its turn.
    waiting = await wait_status(agent_client, auth, cid)
    assert waiting["execution_status"] == "waiting_for_confirmation"
    assert (workspace / "made").exists()
    resp = await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    done = await wait_status(agent_client, auth, cid)
    assert done["execution_status"] == "finished"
    assert done["pending_action_ids"] == []
    items = await events(agent_client, auth, cid)
    assert statuses(items) == [
        "running",
        "waiting_for_confirmation",
        "running",
        "waiting_for_confirmation",
        "running",
        "finished",
    ]


async def test_confirmation_reject_gives_user_reject_observation(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    local_fake_llm.script(
        [reply_tool_call("terminal", {"command": "touch made"}), reply_text("ok")]
    )
    cid = (await start(agent_client, auth, local_fake_llm, confirmation_mode=True))["id"]
    await wait_status(agent_client, auth, cid)
    resp = await agent_client.post(
        f"{BASE}/{cid}{CONFIRM}", json={"accept": False, "reason": "not that"}, headers=auth
    )
    assert resp.status == 200
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert not (workspace / "made").exists()
    items = await events(agent_client, auth, cid)
    action = of_kind(items, "ActionEvent")[0]
    rejection = of_kind(items, "UserRejectObservation")[0]
    assert rejection["action_id"] == action["id"]
    assert rejection["tool_call_id"] == action["tool_call_id"]
    assert rejection["rejection_reason"] == "not that"
    assert of_kind(items, "ObservationEvent") == []
    assert "not that" in local_fake_llm.requests[1].body["messages"][-1]["content"]
    resp = await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    assert resp.status == 409


async def test_pause_mid_run_then_run_again(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "echo step"}), reply_finish()])
    local_fake_llm.hold()
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    await local_fake_llm.wait_for_requests(1)
    resp = await agent_client.post(f"{BASE}/{cid}/pause", headers=auth)
    assert resp.status == 200
    local_fake_llm.release()
    paused = await wait_status(agent_client, auth, cid)
    assert paused["execution_status"] == "paused"
    items = await events(agent_client, auth, cid)
    # The current step (the LLM call and its action) completes before the pause.
    assert len(of_kind(items, "ObservationEvent")) == 1
    assert len(local_fake_llm.requests) == 1
    assert stop_reasons(items) == ["paused"]

    resp = await agent_client.post(f"{BASE}/{cid}/run", headers=auth)
    assert resp.status == 200
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert statuses(await events(agent_client, auth, cid)) == [
        "running",
        "paused",
        "running",
        "finished",
    ]


async def test_llm_500s_are_retried(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.fail_next(2, status=500)
    local_fake_llm.script([reply_finish()])
    llm = {"num_retries": 2, "log_completions": True}
    cid = (await start(agent_client, auth, local_fake_llm, llm=llm))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert [r.status for r in local_fake_llm.requests] == [500, 500, 200]
    (log,) = of_kind(await events(agent_client, auth, cid), "LLMCompletionLogEvent")
    assert (log["model_name"], log["usage_id"]) == ("fake-model", "agent")
    assert log["filename"].startswith("fake-model-")
    data = json.loads(log["log_data"])
    assert data["attempts"] == 3
    assert data["usage"] == {"prompt_tokens": 100, "completion_tokens": 20}
    assert LLM_KEY not in log["log_data"]


async def test_llm_429_and_dropped_connection_are_retried(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.fail_next(1, status=429, retry_after=0.01)
    local_fake_llm.disconnect_next(1)
    local_fake_llm.script([reply_finish()])
    cid = (await start(agent_client, auth, local_fake_llm, llm={"num_retries": 3}))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert len(local_fake_llm.requests) == 3


async def test_persistent_llm_failure_is_an_llm_error(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.fail_next(10, status=503)
    began = time.monotonic()
    cid = (await start(agent_client, auth, local_fake_llm, llm={"num_retries": 2}))["id"]
    done = await wait_status(agent_client, auth, cid, timeout=10)
    assert time.monotonic() - began < 5
    assert done["execution_status"] == "error"
    assert len(local_fake_llm.requests) == 3
    items = await events(agent_client, auth, cid)
    error = of_kind(items, "ConversationErrorEvent")[0]
    assert error["code"] == "LLMError"
    assert "3 attempt(s)" in error["detail"]
    assert "503" in error["detail"]
    assert stop_reasons(items) == ["llm_error"]


async def test_unreachable_llm_and_4xx_fail_fast(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.fail_next(1, status=400, body='{"error": "bad model"}')
    cid = (await start(agent_client, auth, local_fake_llm, llm={"num_retries": 5}))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "error"
    assert len(local_fake_llm.requests) == 1  # a 400 is not retried
    error = of_kind(await events(agent_client, auth, cid), "ConversationErrorEvent")[0]
    assert "HTTP 400" in error["detail"]
    assert "bad model" in error["detail"]

    dead = {"base_url": "http://127.0.0.1:9/v1", "num_retries": 1, "timeout": 2}
    cid = (await start(agent_client, auth, local_fake_llm, llm=dead))["id"]
    done = await wait_status(agent_client, auth, cid, timeout=10)
    assert done["execution_status"] == "error"
    error = of_kind(await events(agent_client, auth, cid), "ConversationErrorEvent")[0]
    assert error["code"] == "LLMError"
    assert "connection error" in error["detail"]


async def test_start_is_idempotent_and_routes_answer_404_409_422(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    cid = "0193d6e4c2b87a3f9e1d2c3b4a596877"
    first = await start(agent_client, auth, local_fake_llm, None, conversation_id=cid)
    assert first["id"] == "0193d6e4-c2b8-7a3f-9e1d-2c3b4a596877"
    assert first["execution_status"] == "idle"
    assert first["max_iterations"] == 500  # the SDK's default
    assert first["metrics"]["model_name"] == "fake-model"
    assert first["title"] is None
    assert first["agent"]["llm"]["api_key"] == MASK
    again = await start(
        agent_client,
        auth,
        local_fake_llm,
        None,
        conversation_id=first["id"],
        expect=200,
        max_iterations=5,
    )
    assert again["max_iterations"] == 500  # nothing changed

    unknown = "f" * 32
    for method, path in [
        ("GET", f"{BASE}/{unknown}"),
        ("DELETE", f"{BASE}/{unknown}"),
        ("POST", f"{BASE}/{unknown}/run"),
        ("POST", f"{BASE}/{unknown}/pause"),
        ("GET", f"{BASE}/not-an-id"),
    ]:
        resp = await agent_client.request(method, path, headers=auth)
        assert resp.status == 404, path
        assert (await resp.json())["detail"].startswith("Conversation not found: ")

    agent = {"kind": "Agent", "llm": llm_config(local_fake_llm)}
    bad_bodies = [
        ({}, ["body", "agent"]),
        ({"agent": {"llm": {"model": ""}}}, ["body", "agent", "llm", "model"]),
        ({"agent": {**agent, "kind": "ACPAgent"}}, ["body", "agent", "kind"]),
        ({"agent": agent, "max_iterations": 0}, ["body", "max_iterations"]),
        ({"agent": agent, "secrets_encrypted": True}, ["body", "secrets_encrypted"]),
        ({"agent": agent, "secrets": {"A": {"kind": "LookupSecret"}}}, ["body", "secrets", "A"]),
        ({"agent": {**agent, "mcp_config": {"mcpServers": {"x": {}}}}}, ["body", "agent"]),
        (
            {"agent": agent, "confirmation_policy": {"kind": "Sometimes"}},
            ["body", "confirmation_policy", "kind"],
        ),
    ]
    for bad, loc in bad_bodies:
        resp = await agent_client.post(BASE, json=bad, headers=auth)
        assert resp.status == 422, bad
        assert (await resp.json())["detail"][0]["loc"] == loc, bad
    resp = await agent_client.post(BASE, json={"agent": agent})
    assert resp.status == 401

    resp = await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    assert resp.status == 409

    resp = await agent_client.get(BASE, params=[("ids", cid), ("ids", unknown)], headers=auth)
    assert resp.status == 200
    batch = await resp.json()
    assert batch[0]["id"] == first["id"]  # found by its hex id too
    assert batch[1] is None
    resp = await agent_client.get(BASE, headers=auth)
    assert resp.status == 422

    resp = await agent_client.delete(f"{BASE}/{cid}", headers=auth)
    assert resp.status == 200
    assert await resp.json() == {"success": True}
    resp = await agent_client.get(f"{BASE}/{cid}", headers=auth)
    assert resp.status == 404


async def test_event_search_pages_and_single_event(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "true"}), reply_finish()])
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    await wait_status(agent_client, auth, cid)
    everything = await events(agent_client, auth, cid)
    assert len(everything) >= 8
    resp = await agent_client.get(
        f"{BASE}/{cid}/events/search", params={"limit": "3"}, headers=auth
    )
    page = await resp.json()
    assert page["items"] == everything[:3]
    assert page["next_page_id"] == everything[3]["id"]
    resp = await agent_client.get(
        f"{BASE}/{cid}/events/search",
        params={"limit": "3", "page_id": page["next_page_id"]},
        headers=auth,
    )
    assert (await resp.json())["items"] == everything[3:6]
    resp = await agent_client.get(
        f"{BASE}/{cid}/events/search",
        params={"kind": "ActionEvent", "sort_order": "TIMESTAMP_DESC"},
        headers=auth,
    )
    actions = (await resp.json())["items"]
    assert [a["tool_name"] for a in actions] == ["finish", "terminal"]
    resp = await agent_client.get(f"{BASE}/{cid}/events/count", headers=auth)
    assert await resp.json() == len(everything)
    resp = await agent_client.get(f"{BASE}/{cid}/events/{everything[2]['id']}", headers=auth)
    assert await resp.json() == everything[2]
    for params in ({"limit": "0"}, {"limit": "x"}, {"page_id": "nope"}):
        resp = await agent_client.get(f"{BASE}/{cid}/events/search", params=params, headers=auth)
        assert resp.status == 422


async def test_conversations_survive_a_restart(
    make_agent_client: ClientFactory, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("hello")])
    client = await make_agent_client()
    cid = (await start(client, auth, local_fake_llm))["id"]
    await wait_status(client, auth, cid)
    before = await events(client, auth, cid)
    await client.close()

    client = await make_agent_client()  # same state dir
    restored = await info(client, auth, cid)
    assert restored["execution_status"] == "finished"
    assert restored["iterations"] == 1
    assert await events(client, auth, cid) == before
    local_fake_llm.script([reply_finish()])
    resp = await client.post(f"{BASE}/{cid}/run", headers=auth)
    assert resp.status == 200
    assert (await wait_status(client, auth, cid))["execution_status"] == "finished"
    roles = [m["role"] for m in local_fake_llm.requests[-1].body["messages"]]
    assert roles == ["system", "user", "assistant"]


async def test_a_fork_goes_on_from_the_history_carried_under_its_id(
    make_agent_client: ClientFactory, auth: dict[str, str], local_fake_llm: FakeLLM, state_dir: Path
) -> None:
    """A conversation's fork: the control plane restores the source's events and history (no
    meta.json: not its credentials) in the new conversation's directory; the agent, told to
    start that conversation, goes on from them."""
    local_fake_llm.script([reply_text("first answer")])
    client = await make_agent_client()
    source = (await start(client, auth, local_fake_llm, "EARLIER question"))["id"]
    await wait_status(client, auth, source)
    earlier = await events(client, auth, source)
    await client.close()
    fork = "f" * 32
    carried = state_dir / "conversations" / fork
    carried.mkdir()
    for name in ("events.jsonl", "history.jsonl"):
        (carried / name).write_bytes(
            (state_dir / "conversations" / source.replace("-", "") / name).read_bytes()
        )

    client = await make_agent_client()  # the fork's sandbox: its agent boots over them
    local_fake_llm.script([reply_finish()])
    await start(client, auth, local_fake_llm, "LATER question", conversation_id=fork)
    await wait_status(client, auth, fork)
    sent = json.dumps(local_fake_llm.requests[-1].body["messages"])
    assert "EARLIER question" in sent
    assert "first answer" in sent
    assert "LATER question" in sent
    assert (await events(client, auth, fork))[: len(earlier)] == earlier


async def test_pause_while_waiting_for_confirmation_keeps_the_action(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "touch made"}), reply_finish()])
    cid = (await start(agent_client, auth, local_fake_llm, confirmation_mode=True))["id"]
    waiting = await wait_status(agent_client, auth, cid)
    pending = waiting["pending_action_ids"]
    assert len(pending) == 1
    await agent_client.post(f"{BASE}/{cid}/pause", headers=auth)
    paused = await wait_status(agent_client, auth, cid, ("paused",))
    assert paused["pending_action_ids"] == pending
    resp = await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    assert resp.status == 409  # nothing waits while paused
    await agent_client.post(f"{BASE}/{cid}/run", headers=auth)
    again = await wait_status(agent_client, auth, cid)
    assert again["execution_status"] == "waiting_for_confirmation"
    assert again["pending_action_ids"] == pending
    await agent_client.post(f"{BASE}/{cid}{CONFIRM}", json={"accept": True}, headers=auth)
    await wait_status(agent_client, auth, cid, ("waiting_for_confirmation",))
    assert (workspace / "made").exists()
    assert len(local_fake_llm.requests) == 2


async def test_llm_timeout_is_retried_then_an_error(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.hold()
    cid = (await start(agent_client, auth, local_fake_llm, llm={"timeout": 0.3, "num_retries": 1}))[
        "id"
    ]
    done = await wait_status(agent_client, auth, cid, timeout=10)
    assert done["execution_status"] == "error"
    assert len(local_fake_llm.requests) == 2
    error = of_kind(await events(agent_client, auth, cid), "ConversationErrorEvent")[0]
    assert "timed out after 0.3 s" in error["detail"]


async def test_restart_while_running_restores_it_paused(
    make_agent_client: ClientFactory, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_finish(), reply_finish()])  # the first answer goes nowhere
    local_fake_llm.hold()
    client = await make_agent_client()
    cid = (await start(client, auth, local_fake_llm))["id"]
    await local_fake_llm.wait_for_requests(1)
    await client.close()  # the server stops in the middle of the LLM call
    local_fake_llm.release()

    client = await make_agent_client()
    restored = await info(client, auth, cid)
    assert restored["execution_status"] == "paused"
    resp = await client.post(f"{BASE}/{cid}/run", headers=auth)
    assert resp.status == 200
    assert (await wait_status(client, auth, cid))["execution_status"] == "finished"
    assert statuses(await events(client, auth, cid)) == ["running", "paused", "running", "finished"]


async def test_working_dir_and_secrets_reach_the_commands(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, workspace: Path
) -> None:
    local_fake_llm.script(
        [
            reply_tool_call("terminal", {"command": 'pwd; test "$TOKEN" = s3cr3t-value'}),
            reply_finish(),
        ]
    )
    cid = (
        await start(
            agent_client,
            auth,
            local_fake_llm,
            working_dir="sub/dir",
            secrets={"TOKEN": "s3cr3t-value"},
            system_message_suffix="Always be brief.",
        )
    )["id"]
    await wait_status(agent_client, auth, cid)
    observation = of_kind(await events(agent_client, auth, cid), "ObservationEvent")[0][
        "observation"
    ]
    assert observation["content"][0]["text"].startswith(str(workspace / "sub/dir"))
    assert observation["exit_code"] == 0
    system = local_fake_llm.requests[0].body["messages"][0]["content"]
    assert system.endswith("Always be brief.")
    assert str(workspace / "sub/dir") in system


async def test_search_and_count_conversations(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    ids = [(await start(agent_client, auth, local_fake_llm, None))["id"] for _ in range(3)]
    resp = await agent_client.get(f"{BASE}/count", headers=auth)
    assert await resp.json() == 3
    oldest_first = {"sort_order": "CREATED_AT"}
    resp = await agent_client.get(
        f"{BASE}/search", params={"limit": "2", **oldest_first}, headers=auth
    )
    page = await resp.json()
    assert [c["id"] for c in page["items"]] == ids[:2]
    assert page["next_page_id"] == ids[2]
    resp = await agent_client.get(
        f"{BASE}/search", params={"page_id": page["next_page_id"], **oldest_first}, headers=auth
    )
    page = await resp.json()
    assert [c["id"] for c in page["items"]] == ids[2:]
    assert page["next_page_id"] is None
    resp = await agent_client.get(
        f"{BASE}/search", headers=auth
    )  # newest first, as the SDK's default
    assert [c["id"] for c in (await resp.json())["items"]] == ids[::-1]
    resp = await agent_client.get(f"{BASE}/search", params={"status": "idle"}, headers=auth)
    assert len((await resp.json())["items"]) == 3
    resp = await agent_client.get(f"{BASE}/count", params={"status": "running"}, headers=auth)
    assert await resp.json() == 0
    for bad in ({"status": "sleepy"}, {"sort_order": "TITLE"}):
        resp = await agent_client.get(f"{BASE}/search", params=bad, headers=auth)
        assert resp.status == 422
