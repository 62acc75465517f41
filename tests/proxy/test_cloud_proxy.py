"""Agent Canvas's way to a sandbox's agent server in cloud mode: `POST /api/cloud-proxy` with its
envelope (agent-canvas 1.6.1 `src/api/cloud/proxy.ts`, the typescript client's
`requestThroughProxy`), and the conversation's git and file reads on the control plane
(`GET /api/v1/app-conversations/{id}/git/changes|diff`, `/file`; agent-canvas
`src/api/git-service/agent-server-git-service.api.ts`, `src/api/cloud/conversation-service.api.ts`).
The real app drives both in tests/clients/test_agent_canvas.py."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    message,
    start_and_wait,
    status_is,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api

pytestmark = pytest.mark.usefixtures("sandbox_images")
MAKE_REPO = "cd /workspace && git init -q && printf 'hello canvas\\n' > notes.txt"


async def conversation_with_a_file(api: Api, fake_llm: FakeLLM) -> dict[str, Any]:
    fake_llm.script([reply_tool_call("terminal", {"command": MAKE_REPO}), reply_finish("done")])
    task = await start_and_wait(api, initial_message=message("make a file"))
    assert task["status"] == "READY", task
    await wait_finished(api, task["app_conversation_id"])
    conversation: dict[str, Any] = await api.ok(
        "GET", f"/api/v1/app-conversations/{task['app_conversation_id']}"
    )
    return conversation


def envelope(conversation: dict[str, Any], method: str, path: str, **extra: Any) -> dict[str, Any]:
    """What CloudClient.requestThroughProxy posts for a runtime call (authMode session-api-key,
    hostOverride = buildHttpBaseUrl(conversation_url))."""
    parts = urlsplit(conversation["conversation_url"])
    return {
        "host": f"{parts.scheme}://{parts.netloc}",
        "method": method,
        "path": path,
        "headers": {"X-Session-API-Key": conversation["session_api_key"], "X-Org-Id": "deployment"},
        "body": None,
    } | extra


async def proxy(api: Api, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with api.http.post(
        api.base + "/api/cloud-proxy",
        json=body,
        headers=api.headers if headers is None else headers,
    ) as resp:
        return resp.status, await resp.read()


async def test_git_and_file_reads_of_a_conversation(user: UserFactory, fake_llm: FakeLLM) -> None:
    alice, bob = await user("alice"), await user("bob")
    conversation = await conversation_with_a_file(alice, fake_llm)
    base = f"/api/v1/app-conversations/{conversation['id']}"

    # Canvas roots a cloud conversation at /workspace/project: our project directory here.
    changes = await alice.ok("GET", f"{base}/git/changes", params={"path": "/workspace/project"})
    assert [c["path"] for c in changes] == ["notes.txt"]
    diff = await alice.ok(
        "GET", f"{base}/git/diff", params={"path": "/workspace/project/notes.txt"}
    )
    assert diff == {"modified": "hello canvas\n", "original": ""}
    async with alice.http.get(
        alice.base + f"{base}/file",
        params={"file_path": "/workspace/project/notes.txt"},
        headers=alice.headers,
    ) as resp:
        assert resp.status == 200
        assert await resp.read() == b"hello canvas\n"
    status, body = await alice.call("GET", f"{base}/file", params={"file_path": "/nope.txt"})
    assert status == 404, body  # the agent server's answer, passed on

    for path, params in (
        ("git/changes", {"path": "/workspace"}),
        ("file", {"file_path": "/workspace/notes.txt"}),
    ):
        assert (await bob.call("GET", f"{base}/{path}", params=params))[0] == 404
    assert (await alice.call("GET", f"{base}/git/changes"))[0] == 422
    assert (await alice.call("GET", f"{base}/file", params={"file_path": "/x", "y": "1"}))[0] == 422

    await alice.ok("POST", f"/api/v1/sandboxes/{conversation['sandbox_id']}/pause")
    status, body = await alice.call("GET", f"{base}/git/changes", params={"path": "/workspace"})
    assert status == 409, body
    assert "PAUSED" in body["detail"]


async def test_the_cloud_proxy_reaches_the_callers_sandbox_only(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice, bob = await user("alice"), await user("bob")
    conversation = await conversation_with_a_file(alice, fake_llm)
    cid = conversation["id"]

    # AgentServerRuntimeService.downloadFile: a file read, bytes as stored.
    read = envelope(conversation, "GET", "/api/file/download?path=%2Fworkspace%2Fnotes.txt")
    assert await proxy(alice, read) == (200, b"hello canvas\n")
    # The envelope alone (Canvas served from another origin sends no credential of ours).
    assert await proxy(alice, read, headers={}) == (200, b"hello canvas\n")
    # A follow-up as AgentServerConversationService.sendMessage sends it: the agent's answer.
    fake_llm.script([reply_finish("second")])
    send = envelope(
        conversation,
        "POST",
        f"/api/conversations/{cid}/events",
        body=message("and again") | {"run": True},
    )
    status, answer = await proxy(alice, send)
    assert (status, json.loads(answer)) == (200, {"success": True})
    events = await wait_events(
        alice, cid, lambda evs: "and again" in json.dumps(evs) and status_is("finished")(evs)
    )
    assert "second" in json.dumps(events)
    # The agent server's own errors come back as they are.
    missing = envelope(conversation, "GET", "/api/file/download?path=%2Fnope")
    status, answer = await proxy(alice, missing)
    assert status == 404
    assert "detail" in json.loads(answer)

    # No open proxy: another host or port, a missing or foreign session key.
    wrong_port = read | {"host": read["host"].rsplit(":", 1)[0] + ":1"}
    elsewhere = read | {"host": "http://example.com:" + read["host"].rsplit(":", 1)[1]}
    for body, expected in (
        (wrong_port, 403),
        (elsewhere, 403),
        (read | {"headers": {}}, 401),
        (read | {"headers": {"X-Session-API-Key": alice.key}}, 401),
    ):
        status, answer = await proxy(alice, body)
        assert status == expected, (body, answer)
        assert "detail" in json.loads(answer)
    # Bob, with alice's sandbox key in hand, is told no such sandbox exists.
    status, _ = await proxy(bob, read)
    assert status == 404
    # Bad envelopes are 422s.
    for bad in (
        read | {"path": "//evil.example/x"},
        read | {"method": "TRACE"},
        read | {"timeout_seconds": 0},
        {"host": "ftp://x", "path": "/"},
    ):
        status, answer = await proxy(alice, bad)
        assert status == 422, (bad, answer)
    # A paused sandbox is not woken by the proxy.
    await alice.ok("POST", f"/api/v1/sandboxes/{conversation['sandbox_id']}/pause")
    status, answer = await proxy(alice, read)
    assert status == 409, answer
