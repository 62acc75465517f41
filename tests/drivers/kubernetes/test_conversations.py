"""Conversations whose sandboxes are pods on the test cluster, end to end through a live control
plane on this host: our agent in a pod, the scripted model (tests/support/fake_llm.py) on the
host's cluster address, which pods reach as host.docker.internal (the pod's hostAliases), and
a conversation that goes on after its pod was deleted by a pause and made again on the same
claim (the agent restores its state from the workspace claim)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from controlplane.config import ServiceConfig
from tests.drivers.kubernetes.sandbox_objects import objects
from tests.support.conversation_helpers import (
    LLM_KEY,
    PRICES,
    UserFactory,
    events_of,
    message,
    new_user,
    of_kind,
    start_and_wait,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.live_server import Api, LiveServer, start_live_server

pytestmark = [pytest.mark.kube, pytest.mark.slow]


@pytest.fixture
async def kube_live(
    make_config: Callable[..., ServiceConfig], kube_overrides: dict[str, Any], fake_llm_port: int
) -> AsyncIterator[LiveServer]:
    """The conversation tests' live server (tests/support/conversation_helpers.py), its
    sandboxes on the cluster (no Docker), the fake model's port open to them."""
    config = make_config(
        reconcile_interval=1.0, llm_prices=PRICES, sandbox_host_ports=[fake_llm_port],
        **kube_overrides,
    )  # fmt: skip
    server = await start_live_server(config)
    yield server
    await server.close()


@pytest.fixture
def kube_user(
    kube_live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    kube_fake_llm: FakeLLM,
) -> UserFactory:
    """A user of `kube_live` whose LLM settings point at the fake model (pods reach this host as
    host.docker.internal)."""

    async def make(name: str = "alice", **settings: Any) -> Api:
        return await new_user(http, kube_live.url, raw_redis, kube_fake_llm, name, **settings)

    return make


def agent_said(text: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(events: list[dict[str, Any]]) -> bool:
        return any(
            e["kind"] == "MessageEvent" and e["source"] == "agent" and text in json.dumps(e)
            for e in events
        )

    return check


async def test_a_conversation_runs_a_command_in_its_pod(
    kube_user: UserFactory,
    kube_fake_llm: FakeLLM,
    kube_overrides: dict[str, Any],
    kube_api: client.ApiClient,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    kube_fake_llm.script(
        [
            reply_tool_call("terminal", {"command": "echo hello from $(hostname) > out.txt"}),
            reply_tool_call("terminal", {"command": "cat /workspace/out.txt"}),
            reply_finish("wrote it"),
        ]
    )
    alice = await kube_user("alice")
    task = await start_and_wait(alice, initial_message=message("write hello to out.txt"))
    assert task["status"] == "READY", task
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    events = await wait_finished(alice, cid)

    pod = (await objects(kube_api, ns, prefix)).pod(sandbox_id)
    actions = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "terminal"]
    assert [a["action"]["command"] for a in actions] == [
        "echo hello from $(hostname) > out.txt",
        "cat /workspace/out.txt",
    ]
    observed = {
        o["action_id"]: o["observation"]
        for o in of_kind(events, "ObservationEvent")
        if o["action_id"] in {a["id"] for a in actions}
    }
    assert [observed[a["id"]]["exit_code"] for a in actions] == [0, 0]
    # The command ran in the sandbox's pod (its hostname is the pod's name).
    assert f"hello from {pod['metadata']['name']}" in json.dumps(observed[actions[1]["id"]])

    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert conversation["sandbox_status"] == "RUNNING"
    assert conversation["execution_status"] == "finished"
    assert conversation["sandbox_id"] == sandbox_id
    # The model was called with the user's key; the key is not in the pod's definition.
    assert kube_fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"
    assert LLM_KEY not in json.dumps(pod)
    assert LLM_KEY not in json.dumps(events)


async def test_a_conversation_goes_on_after_its_pod_was_paused_away(
    kube_user: UserFactory,
    kube_fake_llm: FakeLLM,
    kube_overrides: dict[str, Any],
    kube_api: client.ApiClient,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    kube_fake_llm.script([reply_text("first answer"), reply_text("second answer")])
    alice = await kube_user("alice")
    task = await start_and_wait(alice, initial_message=message("first question"))
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    await wait_events(alice, cid, agent_said("first answer"))
    first_pod = (await objects(kube_api, ns, prefix)).pod(sandbox_id)

    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
    paused = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert paused["sandbox_status"] == "PAUSED"
    found = await objects(kube_api, ns, prefix)
    assert sandbox_id not in found.of("pods")  # the pod is gone, its claim is kept
    assert sandbox_id in found.of("claims")
    assert of_kind(await events_of(alice, cid), "MessageEvent")  # history readable meanwhile

    # A message to a paused conversation resumes its sandbox: a new pod on the same claim.
    await alice.ok(
        "POST", f"/api/v1/app-conversations/{cid}/events", json=message("second question")
    )
    events = await wait_events(alice, cid, agent_said("second answer"), within=90)
    texts = [json.dumps(e["llm_message"]) for e in of_kind(events, "MessageEvent")]
    assert [
        "first question" in texts[0],
        "first answer" in texts[1],
        "second question" in texts[2],
        "second answer" in texts[3],
    ] == [True, True, True, True]
    # The agent in the new pod knew the conversation so far: it sent the model all of it.
    sent = json.dumps(kube_fake_llm.requests[-1].body["messages"])
    assert all(t in sent for t in ("first question", "first answer", "second question")), sent
    second_pod = (await objects(kube_api, ns, prefix)).pod(sandbox_id)
    assert second_pod["metadata"]["uid"] != first_pod["metadata"]["uid"]
    resumed = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert resumed["sandbox_status"] == "RUNNING"
