"""The control plane installed from the manifests we ship (deploy/kubernetes/, the
`external-redis` variant) onto the project's Kubernetes test cluster, and used from outside as a
client would: its image loaded on the nodes, two replicas Ready (`/ready`: Redis and the
Kubernetes API through their service account), the API answering through the Service's
ClusterIP (this host routes the service range), a sandbox created through it landing as a pod in
acs-sandboxes, a conversation with our agent followed through the sandbox proxy
(`/sandboxes/{id}/proxy/agent`), the agent's model calls going through the LLM gateway of a
control plane pod to the scripted model on this host, and the sandbox deleted with its pod and
claim.

A test overlay (kustomize, made in tmp_path on top of the shipped variant) sets only what this
cluster needs: the images' tag, two replicas (two nodes), a fixed ClusterIP for the API's Service
(ACS_PROXY_URL names it: there is no DNS here), the Redis URL and made-up secrets. "External"
Redis is a redis-server this test runs on the cluster's host address (no Redis image here, and no
DNS for the Sentinel StatefulSet's names: that variant's pods are the part not run). The
webhook Service's address reaches the pods as the shipped Deployment says (Kubernetes' service
variables), not from the overlay. NetworkPolicies are stored, not enforced (no policy-aware CNI).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from cryptography.fernet import Fernet
from kubernetes_asyncio import client

from tests.drivers.kubernetes.conftest import KubeCluster
from tests.drivers.kubernetes.sandbox_objects import api_get, eventually, objects, orphans
from tests.drivers.kubernetes.test_shipped_manifests import MANIFESTS, Kubectl, uninstall
from tests.support.control_plane_image import control_plane_image
from tests.support.conversation_helpers import (
    LLM_KEY,
    run_on_agent_socket,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.live_server import Api
from tests.support.redis_server import redis_on_tcp

pytestmark = [pytest.mark.kube, pytest.mark.slow]

SANDBOXES = "acs-sandboxes"
PREFIX = "acs-sandbox-"  # ACS_CONTAINER_PREFIX's default: the manifests do not set it
APP = "app.kubernetes.io/name=acs-control-plane"
REPLY = "hello from the scripted model, through the gateway"


@dataclass(frozen=True)
class Install:
    url: str  # the API's Service, from this host
    bootstrap_key: str
    redis_url: str
    kubectl: Kubectl

    def control_plane_pods(self) -> list[dict[str, Any]]:
        listed = json.loads(self.kubectl("get", "pods", "-n", "acs", "-l", APP, "-o", "json"))
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def external_redis(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[str]:
    """The "external" Redis: a redis-server with a password on the cluster's host address,
    where the control plane's pods reach this host."""
    address, password = kube_cluster.host_address, secrets.token_hex(16)
    data = tmp_path / "redis"
    data.mkdir()
    with redis_on_tcp([address], data, password=password) as port:
        yield f"redis://:{password}@{address}:{port}/0"


def api_address(cluster: KubeCluster) -> str:
    """A fixed ClusterIP for the API's Service, near the end of the range (the API server
    hands out addresses from its start)."""
    return str(ipaddress.ip_network(cluster.service_cidr)[-20])


def overlay_for(copy: Path, tag: str, api_ip: str, cluster: KubeCluster) -> Path:
    """The test's kustomization on top of the shipped external-redis variant (kubectl 1.20's
    kustomize: `bases`, strategic-merge patches). The scripted model is on this host, a machine
    of the pods' LAN: the operator names the cluster's ranges and admits that address
    (docs/deployment.md, "The cluster's ranges")."""
    ranges = ",".join([*(node.pod_cidr for node in cluster.nodes), cluster.service_cidr])
    overlay = copy / "test-overlay"
    overlay.mkdir()
    patches = [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "acs-control-plane", "namespace": "acs"},
         "spec": {"replicas": 2}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "acs-control-plane", "namespace": "acs"},
         "spec": {"clusterIP": api_ip}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "acs-config", "namespace": "acs"},
         "data": {"ACS_PROXY_URL": f"http://{api_ip}", "ACS_IMAGE_TAG": tag,
                  # No warm pools: the create below makes its pod (a claim from the pool is
                  # test_kube_pool.py's), and the openhands spec's image is not on the nodes.
                  "ACS_WARM_POOL": "0",
                  "ACS_KUBE_CLUSTER_CIDRS": ranges,
                  "ACS_OUTBOUND_ALLOW": f"{cluster.host_address}/32"}},
    ]  # fmt: skip
    (overlay / "patches.yaml").write_text(yaml.safe_dump_all(patches))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "bases": ["../external-redis"],
        "images": [{"name": "acs-control-plane", "newTag": tag}],
        "patchesStrategicMerge": ["patches.yaml"],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return overlay


@pytest.fixture
def installed(kube_cluster: KubeCluster, external_redis: str, tmp_path: Path) -> Iterator[Install]:
    kubectl = Kubectl(kube_cluster)
    started = time.monotonic()
    image = control_plane_image()
    built = time.monotonic()
    kube_cluster.load_images(image)  # the default sandbox image is loaded by kube_cluster
    loaded = time.monotonic()
    copy = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, copy)
    bootstrap_key = secrets.token_hex(24)
    made_up = {
        "secret-key": Fernet.generate_key().decode(),
        "bootstrap-api-key": bootstrap_key,
        "redis-url": external_redis,
    }
    for name, value in made_up.items():
        (copy / "external-redis" / name).write_text(value)
    api_ip = api_address(kube_cluster)
    overlay = overlay_for(copy, image.rsplit(":", 1)[1], api_ip, kube_cluster)
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(overlay))) if d]
    # Kubernetes 1.20 has no policy/v1 (test_manifests.py checks the PodDisruptionBudget).
    applied = [d for d in docs if d["kind"] != "PodDisruptionBudget"]
    try:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(applied))
        # Ready = /ready answered 200 (Redis and the Kubernetes API) on both replicas.
        kubectl("rollout", "status", "deployment/acs-control-plane", "-n", "acs", "--timeout=150s")
        print(
            f"image {built - started:.1f}s, loaded onto the nodes {loaded - built:.1f}s, "
            f"applied and Ready {time.monotonic() - loaded:.1f}s"
        )
        yield Install(f"http://{api_ip}", bootstrap_key, external_redis, kubectl)
    except BaseException:
        print(kubectl("get", "pods", "-A", "-o", "wide", check=False))
        print(kubectl("logs", "-n", "acs", "-l", APP, "--tail=60", check=False))
        raise
    finally:
        removing = time.monotonic()
        uninstall(kubectl)
        print(f"uninstalled in {time.monotonic() - removing:.1f}s")


async def run(install: Install, *args: str) -> str:
    """kubectl, off the event loop (the scripted model answers on it meanwhile)."""
    return await asyncio.to_thread(install.kubectl, *args)


async def sandbox_status(api: Api, sandbox_id: str) -> Any:
    status, body = await api.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert status == 200, body
    return body if body["status"] in ("RUNNING", "ERROR") else None


async def test_the_shipped_manifests_run_sandboxes_and_conversations(
    installed: Install,
    kube_cluster: KubeCluster,
    kube_api: client.ApiClient,
    kube_fake_llm: FakeLLM,
) -> None:
    started = time.monotonic()
    pods = installed.control_plane_pods()
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    # Spread over both nodes (the Deployment's anti-affinity), each Ready by its /ready probe.
    assert {p["spec"]["nodeName"] for p in pods} == {n.name for n in kube_cluster.nodes}
    control_plane_ips = {p["status"]["podIP"] for p in pods}
    webhooks = json.loads(await run(installed, "get", "service", "acs-webhooks", "-n", "acs",
                                    "-o", "json"))  # fmt: skip
    webhook_ip = webhooks["spec"]["clusterIP"]

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{installed.url}/ready") as resp:
            assert resp.status == 200, await resp.text()
            ready = await resp.json()
        assert ready["redis"] is True  # the "external" Redis on this host
        # The runtime: the Kubernetes API, reached with in-cluster credentials.
        assert (ready["runtime"], ready["driver"]) == (True, "kubernetes")
        admin = Api(http, installed.url, installed.bootstrap_key)
        me = await admin.ok("GET", "/api/v1/users/me")
        assert me["is_admin"] is True, me
        # An operator's first step: a user's key, made by the CLI in a control plane pod.
        made = await run(installed, "exec", "-n", "acs", pods[0]["metadata"]["name"], "--",
                         "controlplane", "keys", "create", "--user", "alice")  # fmt: skip
        alice = Api(http, installed.url, made.strip().splitlines()[-1])
        assert (await alice.ok("GET", "/api/v1/users/me"))["id"] == "alice"
        await alice.ok(
            "POST",
            "/api/settings",
            json={
                "llm_model": "fake-model",
                # This host, as the control plane's pods reach it.
                "llm_base_url": kube_fake_llm.base_url,
                "llm_api_key": LLM_KEY,
            },
        )

        # A sandbox through the API lands as a pod (and its claim) in acs-sandboxes.
        created = await alice.ok("POST", "/api/v1/sandboxes", json={})
        sid = created["id"]
        sandbox = await eventually(lambda: sandbox_status(alice, sid), 90, "sandbox RUNNING", 0.5)
        assert sandbox["status"] == "RUNNING", sandbox
        found = await objects(kube_api, SANDBOXES, PREFIX)
        pod = found.pod(sid)
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["labels"]["acs/sandbox-id"] == sid
        assert pod["spec"]["nodeName"] in {n.name for n in kube_cluster.nodes}
        assert sid in found.of("claims")
        # Its NetworkPolicy (stored, not enforced here) names the control plane as the shipped
        # configuration does: the Deployment's pods in namespace acs, the webhook port.
        control_plane = {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "acs-control-plane"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "acs"}},
        }
        policy = found.of("policies")[sid]["spec"]
        assert [rule["from"] for rule in policy["ingress"]] == [[control_plane]]
        assert {"to": [control_plane], "ports": [{"protocol": "TCP", "port": 3001}]} in policy[
            "egress"
        ]
        # The sandbox reaches the control plane at the webhook Service's address (no DNS),
        # which the shipped Deployment took from Kubernetes' service variables.
        assert {"ip": webhook_ip, "hostnames": ["host.docker.internal"]} in pod["spec"][
            "hostAliases"
        ]
        agent_url = f"{installed.url}/sandboxes/{sid}/proxy/agent"
        assert any(u["url"] == agent_url for u in sandbox["exposed_urls"]), sandbox

        # A conversation in it, followed as a remote client follows it: through the proxy.
        kube_fake_llm.script([reply_text(REPLY)])
        task = await alice.ok("POST", "/api/v1/app-conversations", json={"sandbox_id": sid})
        deadline = time.monotonic() + 90
        while task["status"] not in ("READY", "ERROR"):
            assert time.monotonic() < deadline, task
            await asyncio.sleep(0.2)
            (task,) = await alice.ok(
                "GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}"
            )
        assert task["status"] == "READY", task
        cid = task["app_conversation_id"]
        conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
        assert conversation["sandbox_id"] == sid
        base = conversation["conversation_url"].split("/api/conversations")[0]
        assert base == agent_url
        key = conversation["session_api_key"]
        frames = await run_on_agent_socket(http, base, cid, key, "say hello")
        said = [f for f in frames if f["kind"] == "MessageEvent" and f.get("source") == "agent"]
        assert said, [f["kind"] for f in frames]
        assert REPLY in json.dumps(said[-1]), said
        # The same events reached the control plane: the agent's webhooks, through the
        # acs-webhooks Service, stored in Redis by whichever replica answered.
        events = await wait_finished(alice, cid)
        assert any(
            e["kind"] == "MessageEvent" and e["source"] == "agent" and REPLY in json.dumps(e)
            for e in events
        )
        # The model was called by a control plane pod's gateway, with the user's key, which
        # is nowhere in the sandbox's pod.
        assert kube_fake_llm.requests, "the scripted model was never called"
        assert {r.peer for r in kube_fake_llm.requests} <= control_plane_ips, kube_fake_llm.requests
        assert kube_fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"
        assert LLM_KEY not in json.dumps((await objects(kube_api, SANDBOXES, PREFIX)).pod(sid))

        # Deleted: pod, claim and policy gone, no record left behind.
        await alice.ok("DELETE", f"/api/v1/sandboxes/{sid}")

        async def gone() -> bool:
            names = [f"pods/{PREFIX}{sid}", f"persistentvolumeclaims/{PREFIX}{sid}-workspace"]
            left = [await api_get(kube_api, f"/api/v1/namespaces/{SANDBOXES}/{n}") for n in names]
            return not any(left) and sid not in (await objects(kube_api, SANDBOXES, PREFIX)).of(
                "policies"
            )

        await eventually(gone, 60, "the sandbox's pod, claim and policy deleted")
        store = aioredis.Redis.from_url(installed.redis_url)
        try:
            assert await orphans(kube_api, SANDBOXES, PREFIX, store, "pod_ip") == []
        finally:
            await store.aclose()
    print(f"API, sandbox, conversation and delete: {time.monotonic() - started:.1f}s")
