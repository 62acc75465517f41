"""The classic OpenHands web frontend (OpenHands/OpenHands `frontend/` 0.62.0) where it needed
more of us: its default "New Conversation" (the V0 start), the terminal's events under the names
its chat and terminal know, the title from the first message, and VS Code in exposed_urls. Sent
over HTTP and WebSocket with the request shapes of its sources (each test names the file);
why the app itself is not run in a browser here is in docs/api.md#openhands-clients."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api
from tests.support.sandbox_helpers import REPO, spec_dir

pytestmark = pytest.mark.usefixtures("sandbox_images")


async def follow_task(api: Api, conversation_id: str, within: float = 60) -> dict[str, Any]:
    """hooks/query/use-task-polling.ts: /conversations/task-<id> polls the start task, then
    moves to its app_conversation_id."""
    assert conversation_id.startswith("task-")
    task_id = conversation_id.removeprefix("task-")
    async with asyncio.timeout(within):
        while True:
            (task,) = await api.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task_id}")
            if task["status"] in ("READY", "ERROR"):
                return dict(task)
            await asyncio.sleep(0.1)


async def test_new_conversation_with_the_default_flags(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_tool_call("terminal", {"command": "echo classic"}), reply_finish()])
    alice = await user("alice")
    # conversation-service.api.ts createConversation: V0 POST /api/conversations, the body of
    # hooks/mutation/use-create-conversation.ts with no repository (undefined keys are dropped).
    created = await alice.ok(
        "POST",
        "/api/conversations",
        json={
            "initial_user_msg": "Say classic in the terminal\nplease",
            "conversation_instructions": "Be brief.",
        },
    )
    assert created["status"] == "ok"
    assert created["conversation_status"] == "STARTING"
    task = await follow_task(alice, created["conversation_id"])
    assert task["status"] == "READY", task
    cid = task["app_conversation_id"]
    events = await wait_finished(alice, cid)
    first = of_kind(events, "MessageEvent")[0]
    assert first["llm_message"]["content"][0]["text"].startswith("Say classic")
    assert "Be brief." in json.dumps(fake_llm.requests[0].body["messages"][0])
    # The V0 reads the conversation page makes next, and the title (first line of the message).
    legacy = await alice.ok("GET", f"/api/conversations/{cid}")
    assert legacy["conversation_version"] == "V1"
    assert legacy["title"] == "Say classic in the terminal"

    # What cannot be honoured is refused, not dropped; as are unknown keys and bad types.
    for body, loc in (
        ({"replay_json": "[]"}, "body"),
        ({"create_microagent": {"repo": "a/b"}}, "body"),
        ({"repository": "not a repo"}, "repository"),
        ({"selected_branch": "a\x18b~c"}, "selected_branch"),  # the fuzzer once had it a 500
        ({"initial_user_msg": 5}, "initial_user_msg"),
        ({"surprise": 1}, "surprise"),
    ):
        status, answer = await alice.call("POST", "/api/conversations", json=body)
        assert status == 422, (body, answer)
        assert answer["detail"][0]["loc"][:2] in (["body", loc], ["body"]), answer
    assert (await alice.call("POST", "/api/conversations", json={"replay_json": "[]"}))[1][
        "detail"
    ][0]["msg"].endswith("replay_json is not supported by this server")


async def test_the_terminal_under_the_names_the_classic_frontend_knows(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_tool_call("terminal", {"command": "echo old-names"}), reply_finish()])
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("run it"))
    cid = task["app_conversation_id"]
    stored = await wait_finished(alice, cid)
    # Stored and searched as the SDK knows them.
    (action,) = [e for e in of_kind(stored, "ActionEvent") if e["tool_name"] == "terminal"]
    assert action["action"]["kind"] == "TerminalAction"
    # event-service.api.ts searchEventsV1 (the history): the older names, output as a string.
    page = await alice.ok("GET", f"/api/v1/conversation/{cid}/events/search", params={"limit": 100})
    actions = [
        e["action"] for e in of_kind(page["items"], "ActionEvent") if e["tool_name"] == "terminal"
    ]
    assert actions == [dict(action["action"], kind="ExecuteBashAction")]
    (observation,) = [
        e["observation"]
        for e in of_kind(page["items"], "ObservationEvent")
        if e["tool_name"] == "terminal"
    ]
    assert observation["kind"] == "ExecuteBashObservation"
    assert observation["output"].strip() == "old-names"
    assert observation["content"]  # the SDK's field stays
    assert observation["exit_code"] == 0
    # The finish observation keeps its name; the frontend reads its text from `message`.
    (finish,) = [
        e["observation"]
        for e in of_kind(page["items"], "ObservationEvent")
        if e["tool_name"] == "finish"
    ]
    assert (finish["kind"], finish["message"]) == ("FinishObservation", "done")
    (kept,) = [e for e in of_kind(stored, "ObservationEvent") if e["tool_name"] == "finish"]
    assert "message" not in kept["observation"]  # stored as the SDK knows it

    # contexts/conversation-websocket-context.tsx: the browser's socket to the agent server
    # (it sends an Origin) gets the same names; the SDK's (no Origin) the SDK's.
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    base = conversation["conversation_url"].split("/api/conversations/")[0]
    socket = f"{base.replace('http', 'ws', 1)}/sockets/events/{cid}?resend_all=true"
    key = {"session_api_key": conversation["session_api_key"]}

    async def kinds(headers: dict[str, str]) -> set[str]:
        seen: set[str] = set()
        async with alice.http.ws_connect(socket, params=key, headers=headers) as ws:
            while "ObservationEvent" not in {k.split(":")[0] for k in seen}:
                event = await ws.receive_json(timeout=10)
                inner = event.get("action") or event.get("observation") or {}
                seen.add(f"{event['kind']}:{inner.get('kind')}")
        return seen

    browser = await kinds({"Origin": "http://localhost:3001"})
    assert "ActionEvent:ExecuteBashAction" in browser
    assert "ObservationEvent:ExecuteBashObservation" in browser
    sdk = await kinds({})
    assert "ActionEvent:TerminalAction" in sdk
    assert "ObservationEvent:TerminalObservation" in sdk


VSCODE_SPEC = (
    (REPO / "specs" / "default.yaml")
    .read_text()
    .replace("id: default", "id: with-vscode")
    .replace("default: true", "default: false")
    .replace("  AGENT_SERVER: 8000", "  AGENT_SERVER: 8000\n  VSCODE: 8001")
)


async def test_a_spec_with_vs_code_exposes_it_as_openhands_does(
    make_client: Any,
    user_headers: Any,
    test_prefix: str,
    tmp_path: Path,
) -> None:
    client = await make_client(
        with_sandboxes=True,
        container_prefix=test_prefix,
        spec_dir=spec_dir(tmp_path, {"with-vscode": VSCODE_SPEC}),
    )
    alice, admin = await user_headers("alice"), await user_headers("root", admin=True)
    started = await client.post(
        "/api/v1/sandboxes", json={"sandbox_spec_id": "with-vscode"}, headers=alice
    )
    sandbox = await started.json()
    async with asyncio.timeout(60):
        while sandbox["status"] != "RUNNING":
            await asyncio.sleep(0.1)
            sandbox = await (
                await client.get(f"/api/v1/sandboxes/{sandbox['id']}", headers=alice)
            ).json()
    urls = {u["name"]: u for u in sandbox["exposed_urls"]}
    # hooks/query/use-unified-vscode-url.ts reads the VSCODE entry of the sandbox's exposed_urls.
    vscode = urlsplit(urls["VSCODE"]["url"])
    assert parse_qs(vscode.query) == {"tkn": [sandbox["session_api_key"]], "folder": ["/workspace"]}
    assert urls["AGENT_SERVER"]["url"].endswith(f":{urls['AGENT_SERVER']['port']}")
    # The token is the owner's session key: an admin looking on gets the URL without it.
    seen = await (await client.get(f"/api/v1/sandboxes/{sandbox['id']}", headers=admin)).json()
    assert "tkn=" not in {u["name"]: u for u in seen["exposed_urls"]}["VSCODE"]["url"]
