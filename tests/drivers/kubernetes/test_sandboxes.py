"""Sandboxes on the test cluster through the control plane's API: create, pause (the pod goes, the
claim stays, the memory reservation is given back), resume (a new pod on the same workspace),
delete (nothing left); sandboxes spread over both nodes; a per-sandbox Service whose address
stays the same across a pause."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from controlplane.store import keyspace
from tests.drivers.kubernetes.conftest import KubeCluster
from tests.drivers.kubernetes.sandbox_objects import api_get, eventually, objects, orphans
from tests.support.sandbox_helpers import agent_call, lifecycle, start, start_running, wait_status
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]
Headers = Callable[..., Awaitable[dict[str, str]]]


async def agent_url(body: dict[str, Any]) -> str:
    (url,) = [u["url"] for u in body["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    return str(url)


async def run(body: dict[str, Any], command: str) -> dict[str, Any]:
    """A shell command in the sandbox, at the URL its owner is given (retried while a fresh
    pod's agent server comes up)."""
    url = await agent_url(body)
    for _ in range(50):
        try:
            return await agent_call(url, body["session_api_key"], command)
        except (OSError, aiohttp.ClientError, AssertionError):
            await asyncio.sleep(0.1)
    return await agent_call(url, body["session_api_key"], command)


async def test_create_pause_resume_delete_through_the_api(
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(with_sandboxes=True, **kube_overrides)
    alice = await user_headers("alice")
    running = await start_running(api, alice, within=60)
    sandbox_id = running["id"]
    wrote = await run(running, "echo kept > /workspace/mark && id -u")
    assert wrote["stdout"].split() == ["1000"], wrote

    found = await objects(kube_api, ns, prefix)
    pod = found.pod(sandbox_id)
    assert urlsplit(await agent_url(running)).hostname == pod["status"]["podIP"]
    assert sandbox_id in found.of("claims")
    assert sandbox_id in found.of("policies")
    assert await raw_redis.hexists(keyspace.MEMORY_RESERVED, sandbox_id)

    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)).status == 200
    paused = await (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).json()
    assert paused["status"] == "PAUSED"
    found = await objects(kube_api, ns, prefix)  # a pod being deleted is left out
    assert sandbox_id not in found.of("pods")
    assert sandbox_id in found.of("claims")
    assert sandbox_id in found.of("policies")
    # The pod is gone: a paused sandbox on Kubernetes holds no memory.
    assert not await raw_redis.hexists(keyspace.MEMORY_RESERVED, sandbox_id)
    # The pause answers once the DELETE is accepted, before the watch brings the pod's
    # deletion: while the pod stops and goes, every event of it that the reconciler reads
    # agrees with PAUSED. One event, the request's; none from the reconciler.
    pod_path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"

    async def pod_gone() -> bool:
        return not await api_get(kube_api, pod_path)

    await eventually(pod_gone, 90, "the paused pod gone")  # a bound: a loaded host is slow
    await asyncio.sleep(0.5)  # the watch's DELETED event handled
    still = await (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).json()
    assert (still["status"], still["reason"]) == ("PAUSED", None), still
    events = await lifecycle(api, alice, sandbox_id=sandbox_id)
    assert [(e["type"], e["automatic"]) for e in events[:2]] == [
        ("sandbox.paused", False),
        ("sandbox.running", False),
    ], events

    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)).status == 200
    resumed = await wait_status(api, alice, sandbox_id, "RUNNING", within=60)
    read = await run(resumed, "cat /workspace/mark")
    assert read["stdout"].strip() == "kept", read
    again = (await objects(kube_api, ns, prefix)).pod(sandbox_id)
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]  # a new pod, the same claim
    assert await raw_redis.hexists(keyspace.MEMORY_RESERVED, sandbox_id)
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []

    assert (await api.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200
    assert (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 404
    assert (await objects(kube_api, ns, prefix)).sandbox_ids() == set()


async def test_sandboxes_spread_over_both_nodes(
    *,
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    kube_cluster: KubeCluster,
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(with_sandboxes=True, **kube_overrides)
    alice = await user_headers("alice")
    ids = [(await start(api, alice))["id"] for _ in range(4)]
    bodies = await asyncio.gather(*(wait_status(api, alice, i, "RUNNING", 90) for i in ids))
    found = await objects(kube_api, ns, prefix)
    nodes = {found.pod(i)["spec"]["nodeName"] for i in ids}
    assert nodes == {node.name for node in kube_cluster.nodes}
    # Each answers at its own pod's address.
    answers = await asyncio.gather(*(run(body, "hostname") for body in bodies))
    assert len({a["stdout"] for a in answers}) == 4
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []
    for sandbox_id in ids:
        assert (await api.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200
    assert (await objects(kube_api, ns, prefix)).sandbox_ids() == set()


async def test_a_per_sandbox_service_keeps_its_address_across_a_pause(
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(with_sandboxes=True, kube_endpoint="service", **kube_overrides)
    alice = await user_headers("alice")
    running = await start_running(api, alice, within=60)
    sandbox_id = running["id"]
    service = (await objects(kube_api, ns, prefix)).of("services")[sandbox_id]
    address = service["spec"]["clusterIP"]
    assert urlsplit(await agent_url(running)).hostname == address
    assert service["spec"]["selector"]["acs/sandbox-id"] == sandbox_id
    await run(running, "echo kept > /workspace/mark")  # through kube-proxy, from this host

    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)).status == 200
    assert sandbox_id in (await objects(kube_api, ns, prefix)).of("services")
    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)).status == 200
    resumed = await wait_status(api, alice, sandbox_id, "RUNNING", within=60)
    assert await agent_url(resumed) == await agent_url(running)
    read = await run(resumed, "cat /workspace/mark")
    assert read["stdout"].strip() == "kept", read
    assert await orphans(kube_api, ns, prefix, raw_redis, "service") == []

    assert (await api.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200
    await eventually(lambda: _none_left(kube_api, ns, prefix), 10, "the sandbox's objects removed")


async def _none_left(api: client.ApiClient, namespace: str, prefix: str) -> bool:
    return (await objects(api, namespace, prefix)).sandbox_ids() == set()
