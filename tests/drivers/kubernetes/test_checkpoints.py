"""A conversation's checkpoint and rewind with our agent in a pod of the test cluster: the
checkpoint is taken at the second user message, the rewind makes the sandbox's claim and pod
again from it (the workspace and the agent's state, its own session key kept), and the agent
goes on as if the second turn had not happened. Files are read through the sandbox's agent
server, as its user would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.config import ServiceConfig
from tests.checkpoints.test_checkpoints import checkpoints_of, two_turns, wait_turns
from tests.drivers.kubernetes.test_sandboxes import run
from tests.support.conversation_helpers import (
    PRICES,
    UserFactory,
    message,
    new_user,
    wait_conversation,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text
from tests.support.live_server import Api, LiveServer, start_live_server
from tests.support.sandbox_helpers import DEFAULT_IMAGE

pytestmark = [pytest.mark.kube, pytest.mark.slow]
LOADED = 180


@pytest.fixture
async def kube_snap_live(
    make_config: Callable[..., ServiceConfig],
    kube_overrides: dict[str, Any],
    snapshot_settings: dict[str, Any],
    fake_llm_port: int,
) -> AsyncIterator[LiveServer]:
    config = make_config(
        reconcile_interval=1.0, llm_prices=PRICES, sandbox_host_ports=[fake_llm_port],
        snapshot_helper_image=DEFAULT_IMAGE, **kube_overrides, **snapshot_settings,
    )  # fmt: skip
    server = await start_live_server(config)
    yield server
    await server.close()


@pytest.fixture
def kube_snap_user(
    kube_snap_live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    kube_fake_llm: FakeLLM,
) -> UserFactory:
    async def make(name: str = "alice", **settings: Any) -> Api:
        return await new_user(http, kube_snap_live.url, raw_redis, kube_fake_llm, name, **settings)

    return make


async def files_of(api: Api, sandbox_id: str) -> str:
    body = await api.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
    out = await run(body, "cat /workspace/a.txt; test -e /workspace/b.txt || echo absent")
    return str(out["stdout"]).strip()


async def test_a_rewind_on_kubernetes_brings_files_and_agent_state_back(
    kube_snap_user: UserFactory, kube_fake_llm: FakeLLM
) -> None:
    fake_llm = kube_fake_llm
    alice, cid, sandbox_id, before = await two_turns(kube_snap_user, fake_llm)
    assert (await files_of(alice, sandbox_id)).split() == ["two"]  # and b.txt exists
    (checkpoint,) = await checkpoints_of(alice, cid)
    assert checkpoint["event_id"] == before[-1]["id"]
    session_key = (await alice.ok("GET", f"/api/v1/app-conversations/{cid}"))["session_api_key"]

    rewound = await alice.ok(
        "POST", f"/api/v1/app-conversations/{cid}/rewind", json={"checkpoint_id": checkpoint["id"]}
    )
    assert rewound["sandbox_id"] == sandbox_id
    conversation = await wait_conversation(alice, cid, "sandbox_status", "RUNNING", within=LOADED)
    assert conversation["session_api_key"] == session_key
    assert (await files_of(alice, sandbox_id)).split() == ["one", "absent"]

    # The agent goes on from there: the model sees turn 1, not turn 2 (its state came back).
    fake_llm.script([reply_text("THIRD seen"), reply_finish("ok")])
    asked = len(fake_llm.requests)
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("THIRD"))
    await fake_llm.wait_for_requests(asked + 1, timeout=LOADED)
    sent = json.dumps(fake_llm.requests[asked].body["messages"])
    assert "FIRST write one" in sent
    assert "THIRD" in sent
    assert "SECOND write two" not in sent
    await wait_turns(alice, cid, 2)
