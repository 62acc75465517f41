"""Finding 2 of issue 26, on the project's Kubernetes test cluster: Mallory sets her
`llm_base_url` to Bob's sandbox by its pod's IP and by its Service's ClusterIP (both reachable
from the control plane's host, where the gateway runs), to read a canary Bob's agent serves on
a port of his spec. Refused with the default cluster ranges, and with the operator's own (the
cluster's pod and Service CIDRs) even where the rest of 10/8 is admitted; the canary counts no
connection, while the host itself reaches it (the control). An attack of tests/security/ (its
table in docs/security.md), here for the cluster its fixtures bring up.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from tests.drivers.kubernetes.conftest import KubeCluster
from tests.drivers.kubernetes.sandbox_objects import objects
from tests.drivers.kubernetes.test_sandboxes import run
from tests.security.conftest import PROVIDER_KEY
from tests.support import canary_server
from tests.support.hostile_llm import CANARY, contains_canary
from tests.support.sandbox_helpers import REPO, spec_dir, start, wait_status
from tests.support.types import Client, ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]

CANARY_PORT = 8011
CANARIED = (
    (REPO / "specs" / "default.yaml")
    .read_text()
    .replace("id: default", "id: canaried")
    .replace("default: true", "default: false")
    .replace("AGENT_SERVER: 8000", f"AGENT_SERVER: 8000\n  DEV_SERVER: {CANARY_PORT}")
)
CANARY_B64 = base64.b64encode(Path(canary_server.__file__).read_bytes()).decode()
Headers = Callable[..., Awaitable[dict[str, str]]]


@pytest.fixture
def canaried(kube_overrides: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The control plane's settings: sandboxes on the cluster, each with a Service, the spec
    `canaried` (the default one with a second port, DEV_SERVER) among its specs."""
    specs = spec_dir(tmp_path, {"canaried": CANARIED})
    return {**kube_overrides, "kube_endpoint": "service", "spec_dir": specs}


async def start_canary(running: dict[str, Any]) -> None:
    """The canary in Bob's pod, as his agent, through his agent server."""
    command = (
        f"echo {CANARY_B64} | base64 -d > /tmp/canary.py && "
        f"(setsid nohup python3 /tmp/canary.py {CANARY_PORT} {CANARY} /tmp/canary.log "
        "> /dev/null 2>&1 &) && sleep 1 && test -e /tmp/canary.log && echo up"
    )
    out = await run(running, command)
    assert out["stdout"].strip() == "up", out


async def canary_connections(running: dict[str, Any]) -> int:
    return int((await run(running, "grep -c connection /tmp/canary.log || true"))["stdout"])


async def ask(api: Client, mallory: dict[str, str], base: str) -> tuple[int, bytes]:
    settings = {"llm_model": "m", "llm_base_url": base, "llm_api_key": PROVIDER_KEY}
    assert (await api.post("/api/settings", json=settings, headers=mallory)).status == 200
    key = (await (await api.get("/api/keys/llm/byor", headers=mallory)).json())["key"]
    resp = await api.post(
        "/api/v1/llm-gateway/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    return resp.status, await resp.read()


async def test_another_users_pod_and_service_are_never_a_model_server(
    make_client: ClientFactory,
    canaried: dict[str, Any],
    kube_cluster: KubeCluster,
    kube_api: client.ApiClient,
    user_headers: Headers,
) -> None:
    ns, prefix = canaried["kube_namespace"], canaried["container_prefix"]
    api = await make_client(with_sandboxes=True, **canaried)
    bob, mallory = await user_headers("bob"), await user_headers("mallory")
    sandbox_id = (await start(api, bob, "canaried"))["id"]
    running = await wait_status(api, bob, sandbox_id, "RUNNING", within=90)
    await start_canary(running)
    found = await objects(kube_api, ns, prefix)
    pod_ip = found.pod(sandbox_id)["status"]["podIP"]
    service_ip = found.of("services")[sandbox_id]["spec"]["clusterIP"]
    targets = [f"http://{pod_ip}:{CANARY_PORT}/v1", f"http://{service_ip}:{CANARY_PORT}/v1"]

    for base in targets:
        status, body = await ask(api, mallory, base)
        assert status == 400, (base, body)
        assert json.loads(body)["error"]["code"] == "destination_refused"
        assert not contains_canary(body)
    assert await canary_connections(running) == 0

    # The operator's ranges for the cluster, the rest of 10/8 admitted as the LAN: the same.
    cluster = [node.pod_cidr for node in kube_cluster.nodes] + [kube_cluster.service_cidr]
    narrowed = await make_client(
        with_sandboxes=True, kube_cluster_cidrs=cluster, outbound_allow=["10.0.0.0/8"], **canaried
    )
    for base in targets:
        status, body = await ask(narrowed, mallory, base)
        assert status == 400, (base, body)
        assert not contains_canary(body)
    assert await canary_connections(running) == 0

    # The control: this host reaches the canary at both addresses (what refused Mallory was
    # the policy, not the network).
    async with aiohttp.ClientSession() as http:
        for base in targets:
            async with http.post(f"{base}/chat/completions", json={}) as resp:
                assert contains_canary(await resp.read())
    await asyncio.sleep(0.2)
    assert await canary_connections(running) == 2
