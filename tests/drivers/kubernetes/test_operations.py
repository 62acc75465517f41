"""Operations with sandboxes on the test cluster, as with Docker: admission by the nodes'
allocatable memory (a sandbox no node has room for is refused with 429 before anything is made),
the idle reaper pausing a sandbox (its pod goes, its claim stays) with its lifecycle event, and
the Kubernetes metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from controlplane import keys
from tests.conftest import BOOTSTRAP_KEY
from tests.drivers.kubernetes.sandbox_objects import api_get, objects, orphans
from tests.drivers.kubernetes.test_sandboxes import Headers
from tests.ops.test_reaper import backdate
from tests.support.sandbox_helpers import (
    agent_spec,
    lifecycle,
    spec_dir,
    start_running,
    wait_status,
)
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]

HUGE = agent_spec(
    "huge",
    "more memory than any node has",
    """resources:
  memory: 4000g
  memory_reservation: 4000g
warm_pool: 0
""",
)


async def test_admission_reaper_and_metrics(
    *,
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
    raw_redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = await make_client(
        with_sandboxes=True,
        spec_dir=spec_dir(tmp_path, {"huge": HUGE}),
        reaper_interval=3600.0,
        **kube_overrides,
    )
    alice = await user_headers("alice")
    nodes = await api_get(kube_api, "/api/v1/nodes")
    assert len(nodes["items"]) == 2

    # No node has 4000 GiB: refused at once with 429, nothing made.
    resp = await api.post("/api/v1/sandboxes", json={"sandbox_spec_id": "huge"}, headers=alice)
    body = await resp.json()
    assert resp.status == 429, body
    assert "cluster has no room" in str(body), body
    assert resp.headers.get("Retry-After")
    assert (await objects(kube_api, ns, prefix)).sandbox_ids() == set()

    # The idle reaper pauses an idle sandbox: its pod goes, its claim stays.
    resp = await api.post("/api/settings", json={"sandbox_idle_timeout": 60}, headers=alice)
    assert resp.status == 200
    sandbox_id = (await start_running(api, alice, within=60))["id"]
    await backdate(raw_redis, sandbox_id, 120, "last_activity_at")
    paused, retired = await api.app[keys.REAPER].sweep()
    assert (paused, retired) == ([sandbox_id], [])
    body = await wait_status(api, alice, sandbox_id, "PAUSED", within=5)
    assert "timeout 60 s" in body["reason"]
    found = await objects(kube_api, ns, prefix)
    assert sandbox_id not in found.of("pods")
    assert sandbox_id in found.of("claims")
    events = await lifecycle(api, alice, sandbox_id=sandbox_id)
    assert events[0]["type"] == "sandbox.paused"
    assert events[0]["automatic"] is True
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []

    # The driver's metrics are exported (no API error so far, the watch never restarted).
    resp = await api.get("/metrics", headers={"X-Session-API-Key": BOOTSTRAP_KEY})
    text = await resp.text()
    assert resp.status == 200
    assert "# TYPE acs_kubernetes_errors_total counter" in text
    assert "# TYPE acs_kubernetes_watch_restarts_total counter" in text
    assert 'acs_sandboxes{status="PAUSED"} 1.0' in text, text
