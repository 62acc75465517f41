"""Faults with sandboxes on the test cluster: a node lost (its kubelet and dockerd killed with
SIGKILL) and the control plane killed with SIGKILL in the middle of creates.

- A lost node: once the node controller has marked it (its grace period, about 10 s here), its
  sandboxes are ERROR with a reason naming the node within one reconcile interval; the others
  keep running and answering; the lost ones can still be deleted, leaving nothing.
- `controlplane serve` killed while its creates are half made (claims, policies, pods being
  made): started again, it finishes every acknowledged create, and nothing is orphaned: no pod,
  claim, policy or Service without its record, no record without its objects.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from controlplane.auth.service import ApiKeyService
from drivers.kubernetes.names import selector
from drivers.kubernetes.state import parse_time
from tests.drivers.kubernetes.conftest import KubeCluster, KubeNode
from tests.drivers.kubernetes.sandbox_objects import (
    KINDS,
    api_get,
    eventually,
    objects,
    orphans,
    records,
)
from tests.drivers.kubernetes.test_sandboxes import Headers, run
from tests.support.live_server import free_port
from tests.support.sandbox_helpers import IMAGE_TAG, start, wait_status
from tests.support.serve_process import Serve, launch_serve, serve_env
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]

RECONCILE_INTERVAL = 3.0
SANDBOXES = 4


async def node_ready(api: client.ApiClient, name: str) -> tuple[str, datetime | None]:
    """The node's Ready condition: its status and when it last changed."""
    node = await api_get(api, f"/api/v1/nodes/{name}")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    return ready["status"], parse_time(ready.get("lastTransitionTime"))


@pytest.fixture
async def restarts_nodes(
    kube_cluster: KubeCluster, kube_api: client.ApiClient
) -> AsyncIterator[list[KubeNode]]:
    """Nodes the test kills: started again afterwards, and waited for until Ready (the tests
    after this one need both)."""
    killed: list[KubeNode] = []
    yield killed
    for node in killed:
        await asyncio.to_thread(kube_cluster.start_node, node)
    for node in killed:
        await eventually(
            functools.partial(_is_ready, kube_api, node.name), 90, f"{node.name} Ready again", 0.5
        )


async def _is_ready(api: client.ApiClient, name: str) -> bool:
    return (await node_ready(api, name))[0] == "True"


async def test_a_lost_nodes_sandboxes_turn_error_and_the_others_run_on(
    *,
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    kube_cluster: KubeCluster,
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
    restarts_nodes: list[KubeNode],
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(
        with_sandboxes=True, reconcile_interval=RECONCILE_INTERVAL, **kube_overrides
    )
    alice = await user_headers("alice")
    ids = [(await start(api, alice))["id"] for _ in range(SANDBOXES)]
    await asyncio.gather(*(wait_status(api, alice, i, "RUNNING", 90) for i in ids))
    found = await objects(kube_api, ns, prefix)
    on_node = {i: found.pod(i)["spec"]["nodeName"] for i in ids}
    lost = kube_cluster.node("node-2")  # the host's Service traffic goes through node-1
    doomed = {i for i, node in on_node.items() if node == lost.name}
    spared = set(ids) - doomed
    assert doomed, f"no sandbox on {lost.name}: {on_node}"
    assert spared, f"every sandbox on {lost.name}: {on_node}"

    restarts_nodes.append(lost)
    await asyncio.to_thread(kube_cluster.kill_node, lost)
    errors: dict[str, tuple[float, str]] = {}  # sandbox -> (when ERROR was seen, reason)
    marked: datetime | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (marked is None or errors.keys() < doomed):
        status, changed = await node_ready(kube_api, lost.name)
        if marked is None and status != "True":
            marked = changed
        for sandbox_id in doomed - errors.keys():
            body = await (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).json()
            if body["status"] == "ERROR":
                errors[sandbox_id] = (time.time(), str(body.get("reason")))
        await asyncio.sleep(0.2)
    assert marked is not None, f"{lost.name} was never marked NotReady"
    assert errors.keys() == doomed, f"still not ERROR: {doomed - errors.keys()}"
    for sandbox_id, (seen, reason) in errors.items():
        # The node's lastTransitionTime has whole seconds: at most 1 s early.
        after = seen - marked.timestamp()
        print(f"{sandbox_id} ERROR {after:.1f}s after {lost.name} was marked lost: {reason}")
        assert after <= RECONCILE_INTERVAL + 1.0, (sandbox_id, after)
        assert lost.name in reason, reason
        assert "stopped responding" in reason, reason

    # The others are untouched: RUNNING, their agent servers answering.
    for sandbox_id in spared:
        body = await (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).json()
        assert body["status"] == "RUNNING", body
        answer = await run(body, "echo alive")
        assert answer["stdout"].strip() == "alive", answer

    # A lost node's sandbox can still be deleted: its pod, claim and policy go.
    for sandbox_id in doomed:
        assert (await api.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200
    assert (await objects(kube_api, ns, prefix)).sandbox_ids() == spared
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []


def kube_serve_env(
    redis_url: str, overrides: dict[str, Any], data_dir: Path, webhook_port: int
) -> dict[str, str]:
    env = serve_env(redis_url, overrides["container_prefix"], data_dir)
    env.update(
        {
            "ACS_DRIVER": "kubernetes",
            "ACS_KUBECONFIG": str(overrides["kubeconfig"]),
            "ACS_KUBE_NAMESPACE": overrides["kube_namespace"],
            "ACS_KUBE_WEBHOOK_ADDRESS": overrides["kube_webhook_address"],
            "ACS_KUBE_IMAGE_PULL_POLICY": overrides["kube_image_pull_policy"],
            "ACS_KUBE_STORAGE_CLASS": overrides["kube_storage_class"],
            "ACS_KUBE_POD_START_TIMEOUT": "60",
            "ACS_WEBHOOK_PORT": str(webhook_port),
            "ACS_RECONCILE_INTERVAL": str(RECONCILE_INTERVAL),
            "ACS_WARM_POOL": "0",
            "ACS_IMAGE_TAG": IMAGE_TAG,
        }
    )
    return env


@pytest.mark.parametrize("kill_at", ["claims", "pods"])
async def test_sigkill_mid_create_leaves_no_orphan(
    *,
    kill_at: str,
    redis_url: str,
    raw_redis: aioredis.Redis,
    kube_overrides: dict[str, Any],
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    env = kube_serve_env(redis_url, kube_overrides, tmp_path / "data", free_port())
    key = (await ApiKeyService(raw_redis, None).create("alice")).key
    headers = {"X-Session-API-Key": key}
    port = free_port()
    servers: list[Serve] = []
    try:
        async with aiohttp.ClientSession(headers=headers) as http:
            servers.append(await launch_serve(port, env))
            await servers[0].wait_healthy(http)
            url = f"{servers[0].url}/api/v1/sandboxes"

            async def create() -> str:
                async with http.post(url, json={}) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                    return str(body["id"])

            acked = set(await asyncio.gather(*(create() for _ in range(3))))
            # SIGKILL as soon as the first workspace claim (or pod) exists: the creates are at
            # their first objects (claim, policy, pod), none of them running yet.
            await eventually(
                lambda: _any(kube_api, ns, prefix, kill_at), 30, f"one of the {kill_at}", 0.01
            )
            await servers[0].kill()
            stages = await _stages(kube_api, ns, prefix, acked)
            print(f"killed mid-create: {stages}")
            assert any(stage != "running" for stage in stages.values()), stages

            servers.append(await launch_serve(port, env))
            await servers[1].wait_healthy(http)
            problems = await _converge(kube_api, ns, prefix, raw_redis, acked=acked, within=90)
            assert problems == [], problems
            for sandbox_id in acked:
                async with http.get(f"{url}/{sandbox_id}") as resp:
                    body = await resp.json()
                answer = await run(body, "echo up")
                assert answer["stdout"].strip() == "up", answer
    finally:
        for server in servers:
            await server.kill()
    for n, server in enumerate(servers):
        logs = "\n".join(server.lines)
        assert "Task exception was never retrieved" not in logs, f"run {n}:\n{server.logs()}"
        assert "Traceback" not in logs, f"run {n}:\n{server.logs()}"


async def _any(api: client.ApiClient, ns: str, prefix: str, kind: str) -> bool:
    listed = await api_get(api, KINDS[kind].format(ns=ns), labelSelector=selector(prefix))
    return bool(listed.get("items"))


async def _stages(
    api: client.ApiClient, ns: str, prefix: str, sandbox_ids: set[str]
) -> dict[str, str]:
    """How far each create had got: its objects, and whether its pod runs."""
    found = await objects(api, ns, prefix)
    out: dict[str, str] = {}
    for sandbox_id in sandbox_ids:
        pod = found.of("pods").get(sandbox_id)
        if pod is not None and ((pod.get("status") or {}).get("phase") == "Running"):
            out[sandbox_id] = "running"
            continue
        kinds = [k for k in ("claims", "policies", "pods") if sandbox_id in found.of(k)]
        out[sandbox_id] = "+".join(kinds) or "no objects"
    return out


async def _converge(
    api: client.ApiClient,
    ns: str,
    prefix: str,
    redis: aioredis.Redis,
    *,
    acked: set[str],
    within: float,
) -> list[str]:
    """What is still wrong once every acknowledged create is RUNNING with its objects and
    nothing is orphaned, or after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        known = await records(redis)
        problems = await orphans(api, ns, prefix, redis, "pod_ip")
        problems += [f"{i} is {known.get(i)}" for i in acked if known.get(i) != "RUNNING"]
        problems += [f"{i} is an unknown record" for i in known.keys() - acked]
        if not problems or time.monotonic() > deadline:
            return problems
        await asyncio.sleep(0.25)
