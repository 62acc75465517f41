"""The Docker engine killed with SIGKILL and started again (no live-restore): a running sandbox's
container comes back exited; the control plane shows it PAUSED, resumable, with the reason,
within one reconcile interval of the engine answering, and resume finds the workspace intact.

Never the shared engine: the test starts a second dockerd of its own, on its own socket, data
root, exec root and pid file (its own containerd under that exec root), with a default bridge
of its own and no iptables, so it cannot touch the host's networking or the other engine's
containers, and
loads the sandbox image into it with `docker save | docker load`. The control plane runs with
ACS_HOST_FIREWALL=off and a subnet pool of its own (docs/deployment.md#a-second-engine).
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import docker
import pytest

from controlplane import keys
from drivers.docker import names as docker_names
from tests.support.sandbox_helpers import start, wait_status
from tests.support.second_engine import SUBNET_POOL, SecondEngine
from tests.support.types import Client

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.usefixtures("sandbox_images")]

RECONCILE_INTERVAL = 3.0


@pytest.fixture
async def second_engine_client(
    second_engine: SecondEngine,
    make_client: Callable[..., Awaitable[Client]],
    test_prefix: str,
) -> Client:
    return await make_client(
        with_sandboxes=True,
        docker_url=second_engine.url,
        container_prefix=test_prefix,
        sandbox_subnet_pool=SUBNET_POOL,
        host_firewall="off",
        reconcile_interval=RECONCILE_INTERVAL,
    )


def inspect_state(second_engine: SecondEngine, name: str) -> dict[str, Any]:
    out = second_engine.cli("inspect", "--format", "{{json .State}}", name).stdout
    state: dict[str, Any] = json.loads(out)
    return state


# The docker SDK's connection pool drops the keep-alive sockets the killed engine broke without
# closing them (urllib3); they are collected whenever the GC runs, here or later.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_engine_killed_and_restarted_leaves_sandboxes_resumable(
    second_engine: SecondEngine,
    second_engine_client: Client,
    test_prefix: str,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
) -> None:
    # In a thread: `docker save | docker load` of the image takes seconds to tens of seconds,
    # and the app's loop (its watch, its reconciler, their Redis reads) must not stall for it.
    await asyncio.to_thread(second_engine.load, second_engine_client.app[keys.SPECS].default.image)
    alice = await user_headers("alice")
    sandbox = await start(second_engine_client, alice)
    sandbox_id = sandbox["id"]
    await wait_status(second_engine_client, alice, sandbox_id, "RUNNING", within=90)
    name = docker_names.container_name(test_prefix, sandbox_id)
    second_engine.cli("exec", name, "sh", "-c", "echo survived > /workspace/marker")

    second_engine.kill9()
    resp = await second_engine_client.get("/ready")
    assert resp.status == 503
    ready = await resp.json()
    assert ready["runtime"] is False
    assert ready["driver"] == "docker"
    answered = await asyncio.to_thread(second_engine.start)

    # Without live-restore the engine stops what was running when it comes back: SIGTERM to the
    # container's init (our agent image exits 0 on it; an init that ignores it is killed: 137).
    state = inspect_state(second_engine, name)
    assert state["Status"] == "exited", state
    code = str(state["ExitCode"])
    body = await wait_status(
        second_engine_client, alice, sandbox_id, "PAUSED", within=RECONCILE_INTERVAL + 30
    )
    took = time.monotonic() - answered
    assert took <= RECONCILE_INTERVAL + 2, f"PAUSED {took:.1f} s after the engine answered"
    assert f"exit code {code}" in body["reason"], body
    assert "resume" in body["reason"]
    print(f"engine answered; PAUSED {took:.1f} s later; exit code {code}")

    events = await second_engine_client.get(
        "/api/v1/lifecycle-events/search", params={"sandbox_id": sandbox_id}, headers=alice
    )
    latest = (await events.json())["items"][0]
    assert latest["type"] == "sandbox.paused"
    assert latest["automatic"] is True
    assert f"exit code {code}" in latest["reason"]

    resp = await second_engine_client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(second_engine_client, alice, sandbox_id, "RUNNING", within=90)
    marker = second_engine.cli("exec", name, "cat", "/workspace/marker").stdout.decode().strip()
    assert marker == "survived"

    resp = await second_engine_client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 200
    remaining = docker.DockerClient(base_url=second_engine.url)
    try:
        assert not remaining.containers.list(all=True, filters={"name": name})
    finally:
        remaining.close()
    # Collect those sockets now, within this test's filters, not at the end of the session.
    await second_engine_client.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
