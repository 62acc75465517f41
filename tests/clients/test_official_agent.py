"""The official OpenHands agent server (spec `openhands`, agent kind `openhands`) through our API,
end to end with the scripted model: a command runs, every event the server has reaches our
stream in order, the cost is recorded and the budget enforced by the control plane, pause and
resume keep the conversation, delete removes everything. One sandbox serves the whole story
(two conversations in it), as a user would use it: its boot is the slow part. Then `openhands
cloud` (the real CLI) on that spec, through the user's setting and the spec's warm pool."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace
from tests.conftest import BOOTSTRAP_KEY
from tests.support.conversation_helpers import (
    LLM_KEY,
    PRICES,
    UserFactory,
    events_of,
    message,
    of_kind,
    start_and_wait,
    status_is,
    wait_conversation,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.live_server import Api, LiveServer
from tests.support.openhands_clients import OpenHandsVenv, client_env, run
from tests.support.sandbox_helpers import OwnDocker

#: litellm needs a provider in the model name; the fake LLM speaks OpenAI's API.
MODEL = "openai/fake-model"
PRICE_IN, PRICE_OUT = PRICES["fake-model"]
CALL_COST = 100 * PRICE_IN + 20 * PRICE_OUT  # the fake's default usage per call

pytestmark = [
    pytest.mark.slow,
    pytest.mark.official_agent,
    pytest.mark.timeout(900),  # its boot and first conversation take minutes on a busy host
    pytest.mark.usefixtures("sandbox_images", "openhands_image"),
    # The disabled openhands spec offered, its model priced, no warm pool unless a test's marker
    # asks; the official server boots in 7-12 s idle, a minute or more on a busy CI host.
    pytest.mark.live_config(
        llm_prices={**PRICES, MODEL: (PRICE_IN, PRICE_OUT)},
        enable_specs=["openhands"],
        warm_pool="*=0",
        pool_interval=0.2,
        start_timeout=240,
    ),
]
#: A stdio MCP server, run with the image's own Python (fastmcp is one of the server's packages).
MCP_CALC = """
from fastmcp import FastMCP
calc = FastMCP("calc")
@calc.tool
def add(a: int, b: int) -> int:
    return a + b
calc.run(show_banner=False)
"""


async def agent_server_events(
    http: aiohttp.ClientSession, url: str, key: str, conversation_id: str
) -> list[dict[str, Any]]:
    """Every event of the conversation as the official server itself lists them."""
    out: list[dict[str, Any]] = []
    page_id: str | None = None
    while True:
        params = {"limit": "100", **({"page_id": page_id} if page_id else {})}
        async with http.get(
            f"{url}/api/conversations/{conversation_id}/events/search",
            params=params,
            headers={"X-Session-API-Key": key},
        ) as resp:
            assert resp.status == 200, await resp.text()
            page = await resp.json()
        out += page["items"]
        page_id = page.get("next_page_id")
        if not page_id:
            return out


async def same_events_as_the_server(
    http: aiohttp.ClientSession, api: Any, url: str, key: str, conversation_id: str
) -> list[dict[str, Any]]:
    """Our stream holds exactly the server's events, in its order (batches may lag a little)."""
    deadline = time.monotonic() + 30
    while True:
        theirs = [e["id"] for e in await agent_server_events(http, url, key, conversation_id)]
        ours = await events_of(api, conversation_id)
        if [e["id"] for e in ours] == theirs or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert [e["id"] for e in ours] == theirs
    return ours


async def test_a_conversation_on_the_official_agent_server(
    *,
    user: UserFactory,
    fake_llm: FakeLLM,
    live: LiveServer,
    http: aiohttp.ClientSession,
    own_docker: OwnDocker,
    raw_redis: aioredis.Redis,
) -> None:
    begun = datetime.now(UTC)
    fake_llm.script(
        [
            reply_tool_call(
                "terminal",
                {"command": 'echo "$MY_TOKEN" | wc -c > /workspace/out.txt && whoami && date +%Z'},
            ),
            reply_finish("wrote it"),
        ]
    )
    alice = await user("alice", llm_model=MODEL)
    await alice.ok(
        "POST",
        "/api/secrets",
        json={"name": "MY_TOKEN", "value": "tok-123456789", "description": ""},
    )
    task = await start_and_wait(
        alice,
        within=300,
        sandbox_spec_id="openhands",
        initial_message=message("Count the token's characters."),
    )
    assert task["status"] == "READY", task
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    sandbox = await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert sandbox["sandbox_spec_id"] == "openhands"
    (url,) = [u["url"] for u in sandbox["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    key = sandbox["session_api_key"]
    ready_activity = sandbox["last_activity_at"]

    events = await wait_finished(alice, cid, within=180)
    events = await same_events_as_the_server(http, alice, url, key, cid)

    # The agent ran the command as `agent`, in UTC, with the user's secret in its environment.
    (container,) = own_docker.containers()
    assert container.exec_run(["cat", "/workspace/out.txt"]).output == b"14\n"
    (action,) = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "terminal"]
    (observation,) = [
        o for o in of_kind(events, "ObservationEvent") if o["action_id"] == action["id"]
    ]
    assert observation["observation"]["exit_code"] == 0
    output = str(observation["observation"])
    assert "agent" in output
    assert "UTC" in output
    assert events[0]["kind"] == "SystemPromptEvent"
    # Naive timestamps are local time, which TZ=UTC makes UTC: all within this test's minutes.
    for event in events:
        when = datetime.fromisoformat(event["timestamp"])
        assert when.tzinfo is None
        assert begun - timedelta(seconds=5) <= when.replace(tzinfo=UTC) <= datetime.now(UTC)

    # The cost, from the server's `stats`; the webhooks counted as activity (the idle reaper's).
    conversation = await wait_conversation(alice, cid, "execution_status", "finished")
    assert conversation["metrics"]["accumulated_cost"] == pytest.approx(2 * CALL_COST)
    assert conversation["metrics"]["accumulated_token_usage"]["prompt_tokens"] == 200
    sandbox = await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert sandbox["last_activity_at"] > ready_activity
    assert fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"
    assert "tok-123456789" not in str(await events_of(alice, cid))

    # Paused: the events are still readable; resumed: the same conversation goes on.
    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}"))["status"] == "PAUSED"
    assert [e["id"] for e in await events_of(alice, cid)] == [e["id"] for e in events]
    fake_llm.script([reply_text("Still here.")])
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("Still there?"))
    later = await wait_events(
        alice,
        cid,
        lambda es: len(of_kind(es, "MessageEvent")) >= 3 and status_is("finished")(es),
        within=180,
    )
    assert later[: len(events)] == events
    replies = [e for e in of_kind(later, "MessageEvent") if e["source"] == "agent"]
    assert "Still here." in str(replies[-1])
    await same_events_as_the_server(http, alice, url, key, cid)

    # A second conversation in the same sandbox, with an MCP server from the user's settings and
    # over a budget of one call (the official server has no budget of its own): the LLM gateway
    # refuses the next call before it reaches the model, and the control plane records the
    # error and pauses it (the second line, for specs without the gateway); whichever lands
    # first decides whether it ends paused or in error.
    calc = {"name": "calc", "command": "/opt/openhands/bin/python", "args": ["-c", MCP_CALC]}
    await alice.ok(
        "POST",
        "/api/settings",
        json={"max_budget_per_task": CALL_COST / 2, "mcp_config": {"stdio_servers": [calc]}},
    )
    fake_llm.script(
        [reply_tool_call("add", {"a": 20, "b": 22})]
        + [reply_tool_call("terminal", {"command": f"sleep 1 && echo step{n}"}) for n in range(7)]
    )
    calls_before = len(fake_llm.requests)
    second = await start_and_wait(
        alice, within=180, sandbox_id=sandbox_id, initial_message=message("Loop.")
    )
    assert second["status"] == "READY", second
    cid2 = second["app_conversation_id"]
    stopped = await wait_events(
        alice, cid2, lambda es: status_is("paused")(es) or status_is("error")(es), within=180
    )
    errors = of_kind(stopped, "ConversationErrorEvent")
    assert 1 <= len(errors) <= 3
    assert "BudgetExceeded" in {e["code"] for e in errors}
    assert {e["code"] for e in errors} <= {"BudgetExceeded", "LLMBadRequestError"}
    for refused in [e for e in errors if e["code"] == "LLMBadRequestError"]:
        assert "BudgetExceeded" in refused["detail"]
    (added,) = [o for o in of_kind(stopped, "ObservationEvent") if o["tool_name"] == "add"]
    assert "42" in json.dumps(added["observation"])
    over = await alice.ok("GET", f"/api/v1/app-conversations/{cid2}")
    assert over["metrics"]["max_budget_per_task"] == pytest.approx(CALL_COST / 2)
    assert over["metrics"]["accumulated_cost"] > CALL_COST / 2
    await asyncio.sleep(2)  # nothing more runs once stopped
    # Only the call that started under the budget reached the model.
    assert len(fake_llm.requests) - calls_before == 1

    # Delete: both conversations, then the sandbox with its container, volume and events.
    await alice.ok("DELETE", f"/api/v1/app-conversations/{cid2}")
    assert own_docker.containers()
    await alice.ok("DELETE", f"/api/v1/app-conversations/{cid}")
    status, _ = await alice.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert status == 404
    assert own_docker.containers() == []
    assert own_docker.client.volumes.list(filters={"name": own_docker.prefix}) == []
    assert not await raw_redis.exists(keyspace.events(cid), keyspace.events(cid2))


async def pool_ready(api: Api, spec: str, within: float) -> str:
    """Wait for a ready member of the spec's warm pool (admin view); its id."""
    admin = Api(api.http, api.base, BOOTSTRAP_KEY)
    deadline = asyncio.get_running_loop().time() + within
    view: dict[str, Any] = {}
    while asyncio.get_running_loop().time() < deadline:
        view = await admin.ok("GET", "/api/v1/sandbox-pool")
        (pool,) = [p for p in view["specs"] if p["spec_id"] == spec]
        ready = [m["id"] for m in pool["members"] if m["ready"] and not m["stale"]]
        if ready:
            return str(ready[0])
        await asyncio.sleep(0.2)
    raise AssertionError(f"no ready member in the {spec} pool: {view}")


@pytest.mark.clients
@pytest.mark.live_config(warm_pool="openhands=1,*=0")
async def test_openhands_cloud_on_the_official_agent_server(
    *,
    openhands_venv: OpenHandsVenv,
    live: LiveServer,
    http: aiohttp.ClientSession,
    fake_llm: FakeLLM,
    raw_redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """`openhands cloud` cannot name a spec: the user's `sandbox_spec_id` setting does, and the
    spec's warm pool gives the conversation an already booted official server."""
    fake_llm.script(
        [
            reply_tool_call(
                "terminal", {"command": "echo from-the-official-server > /workspace/o.txt"}
            ),
            reply_finish("done"),
        ]
    )
    created = await ApiKeyService(raw_redis, None).create("alice")
    alice = Api(http, live.url, created.key)
    settings = {
        "llm_model": "openai/fake-model",
        "llm_base_url": fake_llm.container_base_url,
        "llm_api_key": LLM_KEY,
        "sandbox_spec_id": "openhands",
    }
    await alice.ok("POST", "/api/settings", json=settings)
    member = await pool_ready(alice, "openhands", within=300)
    home = tmp_path / "home"
    token = home / ".openhands" / "cloud" / "api_key.txt"
    token.parent.mkdir(parents=True)
    token.write_text(alice.key)
    work = tmp_path / "project"
    work.mkdir()

    code, out = await run(
        [openhands_venv.bin("openhands"), "cloud", "--server-url", alice.base, "-t", "Say hi"],
        client_env(openhands_venv, home),
        work,
        timeout=180,
    )
    assert code == 0, out
    match = re.search(r"Conversation ID:\s*([0-9a-f]{32})", out)
    assert match, out
    conversation_id = match.group(1)
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{conversation_id}")
    assert conversation["sandbox_id"] == member  # the pooled official server, claimed
    sandbox = await alice.ok("GET", f"/api/v1/sandboxes/{member}")
    assert sandbox["sandbox_spec_id"] == "openhands"
    events = await wait_finished(alice, conversation_id, within=120)
    (action,) = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "terminal"]
    (result,) = [o for o in of_kind(events, "ObservationEvent") if o["action_id"] == action["id"]]
    assert result["observation"]["exit_code"] == 0
    assert "Say hi" in json.dumps(of_kind(events, "MessageEvent")[0])
