"""The project's Kubernetes test cluster for tests marked `kube` (docs/test-cluster.md).

`kube_cluster` (package-scoped: one cluster for every test under tests/drivers/kubernetes, down
after the last one) brings a cluster up in the first free slot with scripts/kube-cluster.sh
(binaries from the cache `make kube-binaries` fills; built here if missing), loads the default
sandbox image onto its nodes, and tears it all down. It skips only where a cluster cannot exist:
not root, or no cached binaries and no Go to build them.
`kube_api` is a kubernetes_asyncio ApiClient built from the cluster's kubeconfig, as a control
plane outside the cluster would build it; `kube_namespace` is a fresh namespace whose default
service account is ready.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from tests.support.conversation_helpers import LLM_KEY
from tests.support.fake_llm import FakeLLM
from tests.support.run_id import RUN_ID
from tests.support.sandbox_helpers import DEFAULT_IMAGE
from tests.support.types import Client, ClientFactory

REPO = Path(__file__).resolve().parents[3]
CLUSTER_SCRIPT = REPO / "scripts" / "kube-cluster.sh"
BUILD_SCRIPT = REPO / "scripts" / "kube" / "build.sh"
UP_TIMEOUT_S = 180


@dataclass(frozen=True)
class KubeNode:
    name: str
    index: int
    ip: str
    pod_cidr: str
    docker_host: str


@dataclass(frozen=True)
class KubeCluster:
    """A running test cluster, as `scripts/kube-cluster.sh env --json` describes it."""

    slot: int
    kubeconfig: Path
    server: str
    host_address: str  # where pods reach this host (the host's end of the cluster bridge)
    service_cidr: str
    storage_class: str
    state_dir: Path
    nodes: tuple[KubeNode, ...]

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> KubeCluster:
        return cls(
            slot=info["slot"],
            kubeconfig=Path(info["kubeconfig"]),
            server=info["server"],
            host_address=info["host_address"],
            service_cidr=info["service_cidr"],
            storage_class=info["storage_class"],
            state_dir=Path(info["state_dir"]),
            nodes=tuple(
                KubeNode(n["name"], n["index"], n["ip"], n["pod_cidr"], n["docker_host"])
                for n in info["nodes"]
            ),
        )

    def cli(self, *args: str, timeout: float = 120) -> str:
        return kube_cli("--slot", str(self.slot), *args, timeout=timeout)

    def load_images(self, *images: str) -> None:
        """Copy images from the host's engine into every node (pods use IfNotPresent)."""
        self.cli("load-image", *images, timeout=300)

    def kill_node(self, node: KubeNode) -> None:
        """SIGKILL the node's kubelet and dockerd: a lost node."""
        self.cli("kill-node", str(node.index))

    def start_node(self, node: KubeNode) -> None:
        self.cli("start-node", str(node.index))

    def node(self, name: str) -> KubeNode:
        return next(node for node in self.nodes if node.name == name)


def kube_cli(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        command = " ".join(args)
        raise AssertionError(
            f"kube-cluster.sh {command} failed ({result.returncode}):\n{result.stderr[-6000:]}"
        )
    return result.stdout


def cluster_unavailable() -> str | None:
    """Why no cluster can be built here, or None."""
    if os.geteuid() != 0:
        return "the Kubernetes test cluster needs root (network namespaces, cgroups, mounts)"
    for tool in ("dockerd", "etcd", "openssl", "nsenter", "unshare", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: run scripts/bootstrap-host.sh --kube (make kube-binaries)"
    if shutil.which("go") is None:
        return "Go is missing, so the cluster's binaries cannot be built: run make kube-binaries"
    return None


def bring_up(owner_pid: int, nodes: int = 2) -> KubeCluster:
    """A cluster in the first free slot, owned by `owner_pid` (a killed owner frees the slot)."""
    out = kube_cli("up", "--any-slot", "--down-on-failure", "--nodes", str(nodes),
                   "--owner-pid", str(owner_pid), timeout=UP_TIMEOUT_S)  # fmt: skip
    return KubeCluster.from_info(json.loads(out))


# Down after the last test under tests/drivers/kubernetes, not at session end.
@pytest.fixture(scope="package")
def kube_cluster() -> Iterator[KubeCluster]:
    reason = cluster_unavailable()
    if reason:
        pytest.skip(reason)
    # Built by `make test-prep` (make kube-binaries); this only finds the cache.
    subprocess.run([str(BUILD_SCRIPT)], check=True, capture_output=True, timeout=3600)
    started = time.monotonic()
    cluster = bring_up(os.getpid())
    print(f"kube cluster up in slot {cluster.slot} in {time.monotonic() - started:.1f}s")
    try:
        cluster.load_images(DEFAULT_IMAGE)
        yield cluster
    finally:
        cluster.cli("down")


async def api_client(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
async def kube_api(kube_cluster: KubeCluster) -> AsyncIterator[client.ApiClient]:
    api = await api_client(kube_cluster.kubeconfig)
    async with api:
        yield api


async def wait_service_account(core: client.CoreV1Api, namespace: str, within: float = 30) -> None:
    """Pods are refused until the namespace's default service account (and its token) exists."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            account = await core.read_namespaced_service_account("default", namespace)
            if account.secrets:
                return
        except client.ApiException as error:
            if error.status != 404:
                raise
        await asyncio.sleep(0.1)
    raise AssertionError(f"namespace {namespace}: no default service account after {within}s")


@pytest.fixture
async def kube_namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    core = client.CoreV1Api(kube_api)
    name = f"t-{secrets.token_hex(4)}"
    # Labelled as deploy/kubernetes labels the sandbox namespace (the Restricted Pod Security
    # Standard; this 1.20 cluster stores the labels but has no admission controller for them).
    labels = {
        f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")
    }
    metadata = client.V1ObjectMeta(name=name, labels=labels)
    await core.create_namespace(client.V1Namespace(metadata=metadata))
    await wait_service_account(core, name)
    yield name
    await core.delete_namespace(name, grace_period_seconds=0)


_prefixes = itertools.count()


@pytest.fixture
def kube_prefix() -> str:
    """This test's deployment prefix (objects of the Kubernetes driver carry it)."""
    return f"acs-test-{RUN_ID}-k{next(_prefixes)}-"


@pytest.fixture
def kube_overrides(
    kube_cluster: KubeCluster, kube_namespace: str, kube_prefix: str
) -> dict[str, Any]:
    """The configuration of a control plane on this host whose sandboxes run on the test
    cluster: its kubeconfig, a fresh namespace, the webhook listener on the host's cluster
    address (where pods reach this host), images loaded onto the nodes (no registry)."""
    return {
        "driver": "kubernetes",
        "kubeconfig": kube_cluster.kubeconfig,
        "kube_namespace": kube_namespace,
        "kube_webhook_address": kube_cluster.host_address,
        "kube_image_pull_policy": "Never",
        "kube_storage_class": kube_cluster.storage_class,
        "container_prefix": kube_prefix,
        "kube_pod_start_timeout": 60.0,
    }


@pytest.fixture
async def kube_fake_llm(kube_cluster: KubeCluster, fake_llm_port: int) -> AsyncIterator[FakeLLM]:
    """The scripted model on the host's cluster address, where pods reach this host (the
    control plane's firewall opens `fake_llm_port` to sandboxes)."""
    fake = FakeLLM(
        host=kube_cluster.host_address, port=fake_llm_port, model="fake-model", api_key=LLM_KEY
    )
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def snap_kube(
    make_client: ClientFactory, kube_overrides: dict[str, Any], snapshot_settings: dict[str, Any]
) -> Client:
    """A control plane whose sandboxes run on the cluster and whose snapshots go to the test's
    registry, which only it reaches. The helper pods run the sandbox image (it has python3 and
    is on the nodes already; a deployment runs acs-base there)."""
    return await make_client(
        with_sandboxes=True,
        **kube_overrides,
        **snapshot_settings,
        snapshot_helper_image=DEFAULT_IMAGE,
    )
