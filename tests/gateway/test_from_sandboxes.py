"""The LLM gateway from inside real sandboxes: conversations of our agent end to end through it
(the scripted OpenAI-compatible model, and an Anthropic-shaped one through LiteLLM), the key
searched for by the agent user in every file, environment, command line and readable process
memory, the budget enforced where the money is spent, and a sandbox's credential refused for
another sandbox's conversation and once its sandbox is deleted. The official agent server's
case: test_llm_gateway_official.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.keys import GATEWAY
from tests.support.conversation_helpers import (
    LLM_KEY,
    PRICES,
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    wait_events,
    wait_finished,
)
from tests.support.fake_anthropic import FakeAnthropic, anthropic_text, anthropic_tool_use
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.key_probe import probe_for
from tests.support.live_server import LiveServer, free_port
from tests.support.sandbox_helpers import (
    REPO,
    OwnDocker,
    call_from,
    exec_as_agent,
    spec_dir,
)

pytestmark = [
    pytest.mark.usefixtures("sandbox_images"),
    pytest.mark.live_config(
        "anthropic_and_direct_spec", llm_prices={**PRICES, "claude-fake-1": (0.003, 0.015)}
    ),
]

ANTHROPIC_KEY = "sk-ant-live-SECRET-4be1"
#: The default spec with the gateway turned off: the control that proves the probe finds a key.
DIRECT_SPEC = (
    (REPO / "specs" / "default.yaml")
    .read_text()
    .replace("id: default", "id: direct")
    .replace("default: true", "default: false\nllm_gateway: false")
    .replace("warm_pool: 2", "warm_pool: 0")
)


@pytest.fixture
def anthropic_port() -> int:
    return free_port()


@pytest.fixture
def anthropic_and_direct_spec(
    fake_llm_port: int, anthropic_port: int, tmp_path: Path
) -> dict[str, Any]:
    """The live server's settings: sandboxes may reach the fake Anthropic's port too, and the
    `direct` spec (the gateway off) stands beside the default."""
    return {
        "sandbox_host_ports": [fake_llm_port, anthropic_port],
        "spec_dir": spec_dir(tmp_path, {"direct": DIRECT_SPEC}),
    }


@pytest.fixture
async def anthropic(anthropic_port: int) -> AsyncIterator[FakeAnthropic]:
    server = FakeAnthropic(port=anthropic_port, api_key=ANTHROPIC_KEY)
    await server.start()
    yield server
    await server.close()


def gateway_url(live: LiveServer) -> str:
    return f"http://host.docker.internal:{live.webhook_port}/api/v1/llm-gateway/v1/chat/completions"


async def test_our_agent_calls_through_the_gateway_and_never_holds_the_key(
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo via-gateway > /workspace/g.txt"}),
            reply_finish("written"),
        ]
    )
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("write g.txt"))
    assert task["status"] == "READY", task
    cid, sid = task["app_conversation_id"], task["sandbox_id"]
    events = await wait_finished(alice, cid)
    tools = [a["tool_name"] for a in of_kind(events, "ActionEvent")]
    assert tools == ["terminal", "finish"]
    # The provider got the real key from the gateway; the agent had only its sandbox token.
    token = live.app[GATEWAY].tokens.issue(sid, cid, "alice")
    assert [r.authorization for r in fake_llm.requests] == [f"Bearer {LLM_KEY}"] * 2
    container = own_docker.container(sid)
    assert (await asyncio.to_thread(exec_as_agent, container, "cat", "/workspace/g.txt"))[1] == (
        "via-gateway"
    )

    report = await probe_for(container, LLM_KEY)
    assert report.found == [], report.found
    # The probe could see what an attacker would: files, every process, the agent's memory.
    assert report.files > 1000
    assert report.environ >= 2
    assert report.read_memory_of("-m agent")
    assert report.mem_bytes > 10_000_000
    # Control: the same probe finds the sandbox token, which the agent does hold.
    control = await probe_for(container, token)
    assert any(place.startswith("mem ") for place in control.found), control.found
    assert any("/var/lib/acs-agent" in place for place in control.found), control.found

    usage = await alice.ok("GET", f"/api/v1/llm-gateway/usage?conversation_id={cid}")
    assert usage["requests"] == 2
    assert usage["cost"] == pytest.approx(2 * (100 * 0.001 + 20 * 0.002))


async def test_a_spec_that_opts_out_hands_the_key_to_the_sandbox(
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    """`llm_gateway: false` (documented as less safe): the key is in the sandbox, and the probe
    that finds nothing elsewhere finds it here."""
    fake_llm.script([reply_finish("direct")])
    alice = await user("alice")
    task = await start_and_wait(alice, sandbox_spec_id="direct", initial_message=message("hi"))
    assert task["status"] == "READY", task
    await wait_finished(alice, task["app_conversation_id"])
    # Called from the sandbox itself, by the name sandboxes give the host, not by the gateway.
    assert fake_llm.requests[-1].headers["Host"].startswith("host.docker.internal:")
    report = await probe_for(own_docker.container(task["sandbox_id"]), LLM_KEY)
    assert any(place.startswith("mem ") for place in report.found), report.found
    assert any(place.startswith("file /var/lib/acs-agent") for place in report.found)


async def test_gateway_budget_stops_a_conversation_the_agent_underprices(
    live: LiveServer, user: UserFactory, fake_llm: FakeLLM
) -> None:
    """The agent knows no price for `openai/fake-model` (its own accounting says $0), the
    gateway prices it as `fake-model`: the call after the budget is refused where the money is
    spent, and the agent surfaces the refusal as an error event."""
    fake_llm.when_exhausted = reply_tool_call("terminal", {"command": "true"})
    alice = await user("alice", llm_model="openai/fake-model", max_budget_per_task=0.3)
    task = await start_and_wait(alice, initial_message=message("spend"))
    cid = task["app_conversation_id"]
    events = await wait_events(
        alice, cid, lambda ev: bool(of_kind(ev, "ConversationErrorEvent")), within=90
    )
    (error,) = of_kind(events, "ConversationErrorEvent")
    assert error["code"] == "LLMError"
    assert "BudgetExceeded" in error["detail"]
    assert "max_budget_per_task" in error["detail"]
    # $0.14 a call: the third started at $0.28, under $0.30; the fourth never reached the model.
    assert len(fake_llm.requests) == 3
    usage = await alice.ok("GET", f"/api/v1/llm-gateway/usage?conversation_id={cid}")
    assert usage["cost"] == pytest.approx(0.42)
    assert usage["requests"] == 3


async def test_anthropic_conversation_end_to_end_through_litellm(
    live: LiveServer,
    user: UserFactory,
    anthropic: FakeAnthropic,
    own_docker: OwnDocker,
) -> None:
    """The most common set-up (`anthropic/…` with an Anthropic key) on our agent, which speaks
    only OpenAI's protocol: the gateway translates both ways, tools included; a streamed call
    from inside the sandbox comes back as OpenAI chunks."""
    anthropic.script(
        [
            anthropic_tool_use("terminal", {"command": "echo from-claude > /workspace/c.txt"}),
            anthropic_text("all done"),
            anthropic_text("streamed reply"),
        ]
    )
    alice = await user(
        "alice",
        llm_model="anthropic/claude-fake-1",
        llm_base_url=anthropic.base_url,
        llm_api_key=ANTHROPIC_KEY,
    )
    task = await start_and_wait(alice, initial_message=message("write c.txt"))
    assert task["status"] == "READY", task
    cid, sid = task["app_conversation_id"], task["sandbox_id"]
    events = await wait_finished(alice, cid, within=150)
    (action,) = of_kind(events, "ActionEvent")
    assert action["tool_name"] == "terminal"
    agent_messages = [e for e in of_kind(events, "MessageEvent") if e["source"] == "agent"]
    assert "all done" in json.dumps(agent_messages[-1])
    container = own_docker.container(sid)
    assert (await asyncio.to_thread(exec_as_agent, container, "cat", "/workspace/c.txt"))[1] == (
        "from-claude"
    )
    first, second = anthropic.requests[:2]
    assert first.headers["x-api-key"] == ANTHROPIC_KEY
    assert first.body["model"] == "claude-fake-1"
    assert {tool["name"] for tool in first.body["tools"]} >= {"terminal", "file_editor"}
    results = [
        block
        for turn in second.body["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block.get("type") == "tool_result"
    ]
    assert results
    assert results[0]["tool_use_id"] == "toolu_1_0"  # the id the fake gave that tool_use

    token = live.app[GATEWAY].tokens.issue(sid, cid, "alice")
    answer = await call_from(
        container, gateway_url(live), token, "anthropic/claude-fake-1", stream=True
    )
    assert answer["status"] == 200, answer
    lines = [line for line in answer["body"].splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "streamed reply"
    assert anthropic.requests[-1].body["stream"] is True
    report = await probe_for(container, ANTHROPIC_KEY)
    assert report.found == [], report.found


async def test_sandbox_credential_is_scoped_to_its_conversation_and_dies_with_it(
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.when_exhausted = reply_finish("ok")
    alice = await user("alice")
    bob = await user("bob")
    one = await start_and_wait(alice, initial_message=message("one"))
    two = await start_and_wait(bob, initial_message=message("two"))
    assert one["status"] == two["status"] == "READY"
    tokens = live.app[GATEWAY].tokens
    container = own_docker.container(one["sandbox_id"])
    url = gateway_url(live)
    own = tokens.issue(one["sandbox_id"], one["app_conversation_id"], "alice")
    ok = await call_from(container, url, own, "fake-model")
    assert ok["status"] == 200, ok

    # Sandbox one's token edited to name bob's conversation: the signature does not hold.
    _, _, _, owner, mac = own.split(".")
    edited = f"acsgw.{two['app_conversation_id']}.{one['sandbox_id']}.{owner}.{mac}"
    # Even a genuine signature over (sandbox one, bob's conversation) is refused: that
    # conversation lives in another sandbox.
    minted = tokens.issue(one["sandbox_id"], two["app_conversation_id"], "alice")
    minted_bob = tokens.issue(one["sandbox_id"], two["app_conversation_id"], "bob")
    session_key = (await alice.ok("GET", f"/api/v1/sandboxes?id={one['sandbox_id']}"))[0][
        "session_api_key"
    ]
    for presented in (edited, minted, minted_bob, session_key, alice.headers["X-Session-API-Key"]):
        refused = await call_from(container, url, presented, "fake-model")
        assert refused["status"] == 401, refused
        assert LLM_KEY not in refused["body"]
    # Another model than the conversation's is not the sandbox's to call.
    other = await call_from(container, url, own, "gpt-4o")
    assert other["status"] == 404, other

    # Deleting a conversation (bob's: his sandbox goes with it), then a sandbox, ends access
    # at once, wherever the token is replayed from.
    two_token = tokens.issue(two["sandbox_id"], two["app_conversation_id"], "bob")
    assert (await call_from(container, url, two_token, "fake-model"))["status"] == 200
    await bob.ok("DELETE", f"/api/v1/app-conversations/{two['app_conversation_id']}")
    assert (await call_from(container, url, two_token, "fake-model"))["status"] == 401
    sent = len(fake_llm.requests)
    await alice.ok("DELETE", f"/api/v1/sandboxes/{one['sandbox_id']}")
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
    async with alice.http.post(
        live.url + "/api/v1/llm-gateway/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {own}"},
    ) as resp:
        assert resp.status == 401, await resp.text()
    assert len(fake_llm.requests) == sent
