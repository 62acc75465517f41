"""What the Kubernetes driver reads once, at the first start after it is made, is read once when
many starts come together (a burst's first cold creates, a pool's first refill), all of them
waiting for that one read (issue 30).

- The storage class's binding mode: a new sandbox's workspace claim is waited for until bound
  (a pod that meets an unbound claim is retried by the scheduler only after a back-off) for as
  long as `Immediate` binding takes. Before, all but the first start were answered "unknown"
  while the read was out, waited at most 2 s for their claims and made pods the scheduler then
  backed off from: 3 of the first 4 cold starts of a burst took 7 s instead of 2-3 s.
- The nodes (admission's memory capacity, and which images they hold): before, each of a
  burst's first creates listed every node, images and all, at once; the first cold creates of a
  burst of 20 were answered after 0.5-1.3 s.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from drivers.kubernetes.api import KubeApi
from drivers.kubernetes.driver import KubernetesDriver
from drivers.kubernetes.network import peers_of
from drivers.kubernetes.resources import Resources
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.kubernetes.conftest import KubeCluster
from tests.support.sandbox_helpers import DEFAULT_IMAGE

pytestmark = [pytest.mark.kube, pytest.mark.slow]

TOGETHER = 8


def settings_of(cluster: KubeCluster, namespace: str) -> KubernetesSettings:
    return KubernetesSettings(
        kubeconfig=cluster.kubeconfig,
        kube_namespace=namespace,
        kube_webhook_address=cluster.host_address,
        kube_image_pull_policy="Never",
        kube_storage_class=cluster.storage_class,
    )


async def answered(kube_api: client.ApiClient, resource: str, verb: str) -> float:
    """How many requests of `verb` on `resource` the API server has answered in JSON (this
    process's clients; the cluster's own components ask in protobuf), from its metrics."""
    response = await kube_api.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )
    text = (await response.read()).decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
        and f'resource="{resource}"' in line
        and f'verb="{verb}"' in line
        and 'contentType="application/json"' in line
    )


async def node_lists(kube_api: client.ApiClient) -> float:
    return await answered(kube_api, "nodes", "LIST")


async def class_reads(kube_api: client.ApiClient) -> float:
    return await answered(kube_api, "storageclasses", "GET")


async def test_starts_that_come_together_all_learn_the_binding_mode(
    kube_cluster: KubeCluster, kube_namespace: str, kube_prefix: str
) -> None:
    settings = settings_of(kube_cluster, kube_namespace)
    credentials = settings.credentials()
    api = KubeApi(credentials)
    resources = Resources(api, settings, kube_prefix, peers_of(settings, credentials))
    try:
        modes = await asyncio.gather(*(resources.binding_mode() for _ in range(TOGETHER)))
    finally:
        await api.close()
    # The test cluster's class binds at once (scripts/kube/kubecluster/api.py).
    assert modes == ["Immediate"] * TOGETHER


async def test_creates_that_come_together_read_the_nodes_once(
    kube_cluster: KubeCluster, kube_namespace: str, kube_prefix: str, kube_api: client.ApiClient
) -> None:
    driver = KubernetesDriver(settings_of(kube_cluster, kube_namespace), prefix=kube_prefix)
    before = await node_lists(kube_api)
    try:
        # What a create asks first (service.start): the image, then admission's capacity. (The
        # image's answer is not checked: a kubelet reports a node's images every 10 s or so,
        # and the fixture has just loaded it.)
        await asyncio.gather(*(driver.image_id(DEFAULT_IMAGE) for _ in range(TOGETHER)))
        capacities = await asyncio.gather(*(driver.memory_capacity() for _ in range(TOGETHER)))
    finally:
        await driver.close()
    assert await node_lists(kube_api) - before == 1
    assert len(set(capacities)) == 1
    assert capacities[0]


async def test_the_driver_reads_them_as_the_control_plane_starts(
    kube_cluster: KubeCluster, kube_namespace: str, kube_prefix: str, kube_api: client.ApiClient
) -> None:
    """prepare() (the control plane's start, in the background) reads both: the first creates
    find them known and ask the API server nothing more."""
    driver = KubernetesDriver(settings_of(kube_cluster, kube_namespace), prefix=kube_prefix)
    before = (await node_lists(kube_api), await class_reads(kube_api))
    try:
        await driver.prepare([])
        prepared = (await node_lists(kube_api), await class_reads(kube_api))
        await asyncio.gather(
            *(driver.image_id(DEFAULT_IMAGE) for _ in range(TOGETHER)),
            *(driver.memory_capacity() for _ in range(TOGETHER)),
        )
        created = (await node_lists(kube_api), await class_reads(kube_api))
    finally:
        await driver.close()
    assert prepared == (before[0] + 1, before[1] + 1)
    assert created == prepared
