"""The warm pool with sandboxes on the test cluster: members wait as running pods (a paused one
would be a cold start at its claim: its pause deleted the pod), a create hands the oldest one
to its user at once, the same pod, and the pool refills behind it."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from tests.drivers.kubernetes.sandbox_objects import objects, orphans
from tests.drivers.kubernetes.test_sandboxes import Headers, run
from tests.sandboxes.test_warm_pool import FAST, create, wait_ready
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]


async def test_a_create_claims_a_running_pool_member(
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(with_sandboxes=True, warm_pool="1", **FAST, **kube_overrides)
    (member,) = await wait_ready(api, 1, within=90)
    pod = (await objects(kube_api, ns, prefix)).pod(member)
    assert pod["status"]["phase"] == "Running"

    alice = await user_headers("alice")
    started = time.monotonic()
    body = await create(api, alice)
    claimed_in = time.monotonic() - started
    print(f"pool claim answered in {claimed_in * 1000:.0f} ms")
    assert body["id"] == member
    assert body["status"] == "RUNNING"
    # The member's own pod, now alice's: her session key opens its agent server.
    answer = await run(body, "id -u && cat /proc/1/cmdline | tr '\\0' ' '")
    assert answer["stdout"].split()[0] == "1000", answer
    claimed_pod = (await objects(kube_api, ns, prefix)).pod(member)
    assert claimed_pod["metadata"]["uid"] == pod["metadata"]["uid"]
    mine = await (await api.get("/api/v1/sandboxes/search", headers=alice)).json()
    assert [s["id"] for s in mine["items"]] == [member]

    # The pool refills with a new pod; the claimed one never goes back.
    (refilled,) = await wait_ready(api, 1, within=90)
    assert refilled != member
    found = await objects(kube_api, ns, prefix)
    assert {member, refilled} <= set(found.of("pods"))
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []
