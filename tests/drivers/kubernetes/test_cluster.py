"""The test cluster does what the Kubernetes driver and the control plane's manifests will need:
two Ready nodes, pods on each, pod addresses reachable from this host and this host from the
pods, a volume that follows its workload to the other node (written as uid 1000 with every
capability dropped), a ClusterIP Service, a service-account token used from inside a pod, and a
lost node noticed within the tuned interval. All through kubernetes_asyncio, as the driver will.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from tests.drivers.kubernetes.conftest import KubeCluster
from tests.drivers.kubernetes.pods import (
    SANDBOX_UID,
    condition,
    pod_manifest,
    run_to_completion,
    wait_gone,
    wait_pod,
)

pytestmark = [pytest.mark.kube, pytest.mark.slow]

# A tiny HTTP server in a pod: answers "pod <node>" on port 8080.
SERVE = """
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("pod " + os.environ["NODE"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""

# Fetches each of $URLS, retrying for up to 30 s: kube-proxy programs a new Service's rules on
# every node shortly after its endpoints appear, not at once.
FETCH = """
import os, time, urllib.request
for url in os.environ["URLS"].split():
    deadline = time.monotonic() + 30
    while True:
        try:
            print(url, urllib.request.urlopen(url, timeout=5).read().decode(), flush=True)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
"""


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": key, "value": value} for key, value in values.items()]


async def test_two_nodes_ready(kube_api: client.ApiClient, kube_cluster: KubeCluster) -> None:
    nodes = (await client.CoreV1Api(kube_api).list_node()).items
    assert sorted(n.metadata.name for n in nodes) == [n.name for n in kube_cluster.nodes]
    for node in nodes:
        expected = kube_cluster.node(node.metadata.name)
        conditions = {c.type: c.status for c in node.status.conditions}
        assert conditions["Ready"] == "True", node.status.conditions
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == expected.ip
        assert node.spec.pod_cidr == expected.pod_cidr
        assert node.status.node_info.kubelet_version == "v1.20.2"
        assert node.status.node_info.container_runtime_version.startswith("docker://")


async def test_sandbox_apis_are_served(
    kube_api: client.ApiClient, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    """What a sandbox is made of, at the GA versions a current cluster serves too: a
    NetworkPolicy (stored; nothing enforces it here), a RuntimeClass whose handler dockershim
    runs ("docker", its only one), a pod using it, and a claim on the default StorageClass."""
    core = client.CoreV1Api(kube_api)
    await client.NetworkingV1Api(kube_api).create_namespaced_network_policy(
        kube_namespace,
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "sandbox"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        },
    )
    runtime_class = f"docker-{kube_namespace}"
    await client.NodeV1Api(kube_api).create_runtime_class(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": runtime_class},
            "handler": "docker",
        }
    )
    try:
        manifest = pod_manifest("classy", "print('ran', flush=True)")
        manifest["spec"]["runtimeClassName"] = runtime_class
        _, log = await run_to_completion(core, kube_namespace, manifest)
        assert log == "ran\n"
    finally:
        await client.NodeV1Api(kube_api).delete_runtime_class(runtime_class)
    await core.create_namespaced_persistent_volume_claim(
        kube_namespace,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "defaulted"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}},
            },
        },
    )
    deadline = time.monotonic() + 30
    while (
        claim := await core.read_namespaced_persistent_volume_claim("defaulted", kube_namespace)
    ).status.phase != "Bound":
        assert time.monotonic() < deadline, claim.status
        await asyncio.sleep(0.2)
    assert claim.spec.storage_class_name == kube_cluster.storage_class  # the default class


@pytest.fixture
async def host_server(kube_cluster: KubeCluster) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server on the host's cluster address; yields its URL and the peers it saw."""
    seen: list[str] = []

    async def hello(request: web.Request) -> web.Response:
        seen.append(request.remote or "")
        return web.Response(text=f"host saw {request.remote}")

    app = web.Application()
    app.router.add_get("/hello", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, kube_cluster.host_address, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{kube_cluster.host_address}:{port}", seen
    finally:
        await runner.cleanup()


async def test_pods_on_each_node_reach_the_host_and_are_reached_from_it(
    kube_api: client.ApiClient,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    host_server: tuple[str, list[str]],
) -> None:
    core = client.CoreV1Api(kube_api)
    host_url, seen = host_server
    script = (
        "import urllib.request, os\n"
        "reply = urllib.request.urlopen(os.environ['HOST_URL'] + '/hello', timeout=10).read()\n"
        # The reply is served back (not printed): a pod's log can vanish, see pods.pod_log.
        "os.environ['NODE'] += ' ' + reply.decode()\n" + SERVE
    )

    async def start(node: str) -> client.V1Pod:
        manifest = pod_manifest(f"web-{node}", script, node=node, readiness_port=8080)
        manifest["spec"]["containers"][0]["env"] = env(NODE=node, HOST_URL=host_url)
        await core.create_namespaced_pod(kube_namespace, manifest)
        return await wait_pod(core, kube_namespace, f"web-{node}", ready=True)

    pods = await asyncio.gather(*(start(node.name) for node in kube_cluster.nodes))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for node, pod in zip(kube_cluster.nodes, pods, strict=True):
            assert pod.spec.node_name == node.name
            pod_ip = pod.status.pod_ip
            assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(node.pod_cidr)
            # host -> pod, over the route to the node's pod CIDR
            async with http.get(f"http://{pod_ip}:8080/") as response:
                assert response.status == 200
                # pod -> host, at the documented host address, seen from the pod's own address
                assert await response.text() == f"pod {node.name} host saw {pod_ip}"
            assert pod_ip in seen


async def test_volume_written_as_uid_1000_follows_its_pod_to_the_other_node(
    kube_api: client.ApiClient, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    first, second = kube_cluster.nodes[0].name, kube_cluster.nodes[1].name
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "work"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": kube_cluster.storage_class,
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }
    await core.create_namespaced_persistent_volume_claim(kube_namespace, claim)
    volume = [{"name": "work", "persistentVolumeClaim": {"claimName": "work"}}]
    mount = [{"name": "work", "mountPath": "/work"}]
    token = secrets.token_hex(8)
    write = (
        "import os\n"
        f"open('/work/proof', 'w').write('{token}')\n"
        "print('uid', os.getuid(), 'owner', os.stat('/work/proof').st_uid, flush=True)\n"
    )
    writer, log = await run_to_completion(
        core, kube_namespace,
        pod_manifest("writer", write, node=first, volumes=volume, mounts=mount),
    )  # fmt: skip
    assert writer.spec.node_name == first
    assert log.strip() == f"uid {SANDBOX_UID} owner {SANDBOX_UID}"

    await core.delete_namespaced_pod("writer", kube_namespace, grace_period_seconds=0)
    await wait_gone(core, kube_namespace, "writer")

    read = (
        "import os\n"
        "print(open('/work/proof').read(), os.stat('/work/proof').st_uid, flush=True)\n"
        "open('/work/again', 'w').write('x')\n"
    )
    reader, log = await run_to_completion(
        core, kube_namespace,
        pod_manifest("reader", read, node=second, volumes=volume, mounts=mount),
    )  # fmt: skip
    assert reader.spec.node_name == second
    assert log.strip() == f"{token} {SANDBOX_UID}"

    # Where it lives: a directory of the cluster's state dir, as the provisioner made it.
    pvc = await core.read_namespaced_persistent_volume_claim("work", kube_namespace)
    pv = await core.read_persistent_volume(pvc.spec.volume_name)
    path = Path(pv.spec.host_path.path)
    assert path.parent == kube_cluster.state_dir / "volumes"
    proof = path / "proof"
    assert await asyncio.to_thread(proof.read_text) == token
    assert (await asyncio.to_thread(proof.stat)).st_uid == SANDBOX_UID

    # Dynamic deprovisioning: the claim deleted, the volume and its directory go too.
    await core.delete_namespaced_pod("reader", kube_namespace, grace_period_seconds=0)
    await wait_gone(core, kube_namespace, "reader")
    await core.delete_namespaced_persistent_volume_claim("work", kube_namespace)
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(path.exists):
        assert time.monotonic() < deadline, f"{path} outlived its claim"
        await asyncio.sleep(0.2)


async def test_cluster_ip_service_answers_in_the_cluster_and_from_the_host(
    kube_api: client.ApiClient, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    first, second = kube_cluster.nodes[0].name, kube_cluster.nodes[1].name
    backend = pod_manifest("backend", SERVE, node=second, labels={"app": "backend"},
                           readiness_port=8080)  # fmt: skip
    backend["spec"]["containers"][0]["env"] = env(NODE=second)
    await core.create_namespaced_pod(kube_namespace, backend)
    service = await core.create_namespaced_service(
        kube_namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "backend"},
            "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip = service.spec.cluster_ip
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network(kube_cluster.service_cidr)
    backend_pod = await wait_pod(core, kube_namespace, "backend", ready=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        endpoints = await core.read_namespaced_endpoints("backend", kube_namespace)
        if endpoints.subsets and endpoints.subsets[0].addresses:
            break
        await asyncio.sleep(0.2)
    assert endpoints.subsets, "the service never got an endpoint"

    urls = f"http://{cluster_ip}/ http://{backend_pod.status.pod_ip}:8080/"
    fetch = pod_manifest("fetch", FETCH, node=first)
    fetch["spec"]["containers"][0]["env"] = env(URLS=urls)
    _, log = await run_to_completion(core, kube_namespace, fetch)
    assert log.splitlines() == [
        f"http://{cluster_ip}/ pod {second}",  # through kube-proxy on the client's node
        f"http://{backend_pod.status.pod_ip}:8080/ pod {second}",  # pod to pod across nodes
    ]
    # The host routes the service range through the first node, whose kube-proxy answers (its
    # rules are in place: the pod on that node just went through them).
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"http://{cluster_ip}/") as response,
    ):
        assert response.status == 200
        assert await response.text() == f"pod {second}"


async def test_service_account_token_works_against_the_api_from_a_pod(
    kube_api: client.ApiClient, kube_namespace: str
) -> None:
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    await rbac.create_namespaced_role(
        kube_namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    await rbac.create_namespaced_role_binding(
        kube_namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "default", "namespace": kube_namespace}
            ],
        },
    )
    script = """
import json, os, ssl, urllib.error, urllib.request
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
base = "https://%s:%s" % (host, port)
account = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(account + "/token").read()
namespace = open(account + "/namespace").read()
context = ssl.create_default_context(cafile=account + "/ca.crt")
def get(path):
    request = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
own = get("/api/v1/namespaces/%s/pods/%s" % (namespace, os.environ["POD_NAME"]))
secrets = get("/api/v1/namespaces/%s/secrets" % namespace)
print(json.dumps({
    "own": [own[0], own[1]["metadata"]["name"]],
    "secrets": [secrets[0], secrets[1]["message"]],
}))
"""
    manifest = pod_manifest("api-user", script)
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    _, log = await run_to_completion(core, kube_namespace, manifest)
    result = json.loads(log)
    assert result["own"] == [200, "api-user"]  # allowed by the Role bound to the account
    status, message = result["secrets"]
    assert status == 403  # authenticated as the account, and nothing more
    assert f"system:serviceaccount:{kube_namespace}:default" in message


async def test_lost_node_goes_not_ready_and_its_pods_are_marked(
    kube_api: client.ApiClient, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    """kill -9 of a node's kubelet and dockerd: the node is NotReady and its pod not Ready within
    the controller manager's grace period plus a few monitor periods; the other node and its
    pod are untouched. Runs last in this module: the node is started again at the end."""
    core = client.CoreV1Api(kube_api)
    survivor_node, lost_node = kube_cluster.nodes[0], kube_cluster.nodes[1]
    info = json.loads(await asyncio.to_thread(kube_cluster.cli, "env", "--json"))["node_monitor"]
    within = info["grace_s"] + 3 * info["period_s"] + 2  # the lease may be a period old
    for node in (survivor_node, lost_node):
        manifest = pod_manifest(f"on-{node.name}", SERVE, node=node.name, readiness_port=8080)
        manifest["spec"]["containers"][0]["env"] = env(NODE=node.name)
        await core.create_namespaced_pod(kube_namespace, manifest)
    for node in (survivor_node, lost_node):
        await wait_pod(core, kube_namespace, f"on-{node.name}", ready=True)

    killed_at = time.monotonic()
    await asyncio.to_thread(kube_cluster.kill_node, lost_node)
    try:
        node_lost_after = pod_marked_after = None
        while time.monotonic() - killed_at < within + 5:
            elapsed = time.monotonic() - killed_at
            node = await core.read_node(lost_node.name)
            ready = next(c for c in node.status.conditions if c.type == "Ready")
            if node_lost_after is None and ready.status != "True":
                node_lost_after = elapsed
            pod = await core.read_namespaced_pod(f"on-{lost_node.name}", kube_namespace)
            if pod_marked_after is None and condition(pod, "Ready") == "False":
                pod_marked_after = elapsed
            if node_lost_after is not None and pod_marked_after is not None:
                break
            await asyncio.sleep(0.2)
        print(
            f"node NotReady after {node_lost_after}s, its pod not Ready after {pod_marked_after}s"
        )
        assert node_lost_after is not None
        assert node_lost_after <= within
        assert pod_marked_after is not None
        assert pod_marked_after <= within
        assert ready.status == "Unknown"  # NodeStatusUnknown: the kubelet stopped posting
        assert ready.reason == "NodeStatusUnknown"

        survivor = await core.read_node(survivor_node.name)
        assert next(c.status for c in survivor.status.conditions if c.type == "Ready") == "True"
        pod = await core.read_namespaced_pod(f"on-{survivor_node.name}", kube_namespace)
        assert pod.status.phase == "Running"
        assert condition(pod, "Ready") == "True"
    finally:
        await asyncio.to_thread(kube_cluster.start_node, lost_node)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        node = await core.read_node(lost_node.name)
        if next(c.status for c in node.status.conditions if c.type == "Ready") == "True":
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"{lost_node.name} did not come back after start-node")
