"""The official OpenHands agent server behind the LLM gateway: its conversation completes
through the gateway with a sandbox token (its LiteLLM calling `openai/<model>` at the
gateway's URL), and the agent user finds the user's key nowhere in the sandbox: not in the start
request the server keeps on disk, not in any environment, command line or readable memory."""

from __future__ import annotations

import pytest

from controlplane.keys import GATEWAY
from tests.support.conversation_helpers import (
    LLM_KEY,
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    status_is,
    wait_events,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.key_probe import probe_for
from tests.support.live_server import LiveServer
from tests.support.sandbox_helpers import OwnDocker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.official_agent,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("sandbox_images", "openhands_image"),
    pytest.mark.live_config(enable_specs=["openhands"], start_timeout=240),
]

MODEL = "openai/fake-model"


async def test_official_agent_server_calls_through_the_gateway_without_the_key(
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.untooled = reply_finish("(untooled)")
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo official > /workspace/o.txt"}),
            reply_finish("written"),
        ]
    )
    alice = await user("alice", llm_model=MODEL, sandbox_spec_id="openhands")
    task = await start_and_wait(alice, within=300, initial_message=message("write o.txt"))
    assert task["status"] == "READY", task
    cid, sid = task["app_conversation_id"], task["sandbox_id"]
    events = await wait_events(
        alice, cid, lambda ev: status_is("finished")(ev) or status_is("error")(ev), within=300
    )
    assert status_is("finished")(events), of_kind(events, "ConversationErrorEvent")
    assert "terminal" in [a["tool_name"] for a in of_kind(events, "ActionEvent")]
    # Every model call reached the provider from the gateway, with the real key, and named the
    # model as the provider knows it.
    assert fake_llm.requests
    assert {r.authorization for r in fake_llm.requests} == {f"Bearer {LLM_KEY}"}
    assert {r.body["model"] for r in fake_llm.requests} == {"fake-model"}
    usage = await alice.ok("GET", f"/api/v1/llm-gateway/usage?conversation_id={cid}")
    assert usage["requests"] == len([r for r in fake_llm.requests if r.status == 200])

    (container,) = [c for c in own_docker.containers() if sid in c.name]
    report = await probe_for(container, LLM_KEY)
    assert report.found == [], report.found
    assert report.read_memory_of("openhands.agent_server")
    assert report.files > 1000
    # Control: the sandbox token the server holds is found in its memory (it writes its LLM
    # key to its state files masked, so memory was the place the key could be read before).
    control = await probe_for(container, live.app[GATEWAY].tokens.issue(sid, cid, "alice"))
    assert any("openhands.agent_server" in place for place in control.found), control.found
