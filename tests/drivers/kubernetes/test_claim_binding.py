"""A new sandbox's workspace claim is waited for until bound (a pod that meets an unbound claim
is retried by the scheduler only after a back-off) by one watch of that claim, not by reading
it: in a cold burst of 20 on two cores the reads were ~16 a start, 316 GETs for 20 sandboxes
on the API server that shares the cores with the binder and the kubelets (issue 30). Counted
from the API server's metrics. A Role without `watch` on claims (one made before the watch) still
starts sandboxes: the claim is read instead, and the refused watch is not asked again.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from controlplane.config import ServiceConfig, load_config
from controlplane.sandboxes.launcher import network_policy, sandbox_request
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.naming import new_sandbox_id
from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.specs.catalog import SpecCatalog
from drivers.base import RunState, SandboxRequest
from drivers.kubernetes import resources
from drivers.kubernetes.driver import KubernetesDriver
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.kubernetes.conftest import REPO, KubeCluster, wait_service_account
from tests.drivers.kubernetes.test_first_reads import answered
from tests.drivers.kubernetes.test_rbac import ACCOUNT, account_kubeconfig, documented_rbac

pytestmark = [pytest.mark.kube, pytest.mark.slow]

TOGETHER = 4
Drivers = Callable[[str, Path, list[str]], KubernetesDriver]
CLAIMS = "persistentvolumeclaims"


def settings_of(cluster: KubeCluster, namespace: str, kubeconfig: Path) -> KubernetesSettings:
    return KubernetesSettings(
        kubeconfig=kubeconfig,
        kube_namespace=namespace,
        kube_webhook_address=cluster.host_address,
        kube_image_pull_policy="Never",
        kube_storage_class=cluster.storage_class,
        kube_pod_start_timeout=90.0,
    )


async def requests_of(
    driver: KubernetesDriver, prefix: str, tmp_path: Path, count: int
) -> list[SandboxRequest]:
    """New sandboxes of the default spec, as the launcher asks for them (their network made
    ready first: it tells where they reach the webhook listener)."""
    config: ServiceConfig = load_config(
        {},
        container_prefix=prefix,
        data_dir=tmp_path / "data",
        image_tag=os.environ.get("ACS_IMAGE_TAG") or None,
    )
    spec = SpecCatalog.load(REPO / "specs", config.image_tag).default
    base = await driver.prepare_network(network_policy(spec))
    return [
        sandbox_request(
            config, SandboxRecord.starting(new_sandbox_id(), "alice", spec.id), spec, base
        )
        for _ in range(count)
    ]


async def claim_requests(kube_api: client.ApiClient) -> dict[str, float]:
    return {verb: await answered(kube_api, CLAIMS, verb) for verb in ("POST", "GET", "WATCH")}


async def settled(
    kube_api: client.ApiClient, before: dict[str, float], watches: int
) -> dict[str, float]:
    """The requests made on claims since `before`, once `watches` watches have ended (the API
    server counts a watch when it ends: the driver closes it once its claim is bound)."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        now = await claim_requests(kube_api)
        made = {verb: now[verb] - before[verb] for verb in now}
        if made["WATCH"] >= watches or asyncio.get_running_loop().time() > deadline:
            return made
        await asyncio.sleep(0.5)


@pytest.fixture
async def drivers(kube_cluster: KubeCluster, kube_prefix: str) -> AsyncIterator[Drivers]:
    """Drivers of the test's deployment with a webhook listener (as a control plane has),
    closed after the test."""
    listener = WebhookListener(0)
    listener.attach(web.Application())
    made: list[KubernetesDriver] = []

    def make(namespace: str, kubeconfig: Path, failed: list[str]) -> KubernetesDriver:
        """`failed`: the operations whose API calls failed (the metrics' hook)."""
        driver = KubernetesDriver(
            settings_of(kube_cluster, namespace, kubeconfig),
            prefix=kube_prefix,
            listener=listener,
            on_error=failed.append,
        )
        made.append(driver)
        return driver

    yield make
    for driver in made:
        await driver.close()
    await listener.close()


async def test_creates_that_come_together_watch_their_claims_rather_than_read_them(
    *,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    kube_prefix: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
    drivers: Drivers,
) -> None:
    failed: list[str] = []
    driver = drivers(kube_namespace, kube_cluster.kubeconfig, failed)
    await driver.prepare([])  # the binding mode known: the class binds at once (Immediate)
    requests = await requests_of(driver, kube_prefix, tmp_path, TOGETHER)
    before = await claim_requests(kube_api)
    states = await asyncio.gather(*(driver.create(r, new=True) for r in requests))
    made = await settled(kube_api, before, TOGETHER)
    assert [s.status for s in states] == [RunState.RUNNING] * TOGETHER
    # One POST and one watch a claim; none read.
    assert made == {"POST": TOGETHER, "GET": 0, "WATCH": TOGETHER}, made
    assert failed == []
    for request in requests:
        await driver.remove(request.sandbox_id)


async def test_starts_past_the_watches_allowed_at_once_read_their_claims(
    *,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    kube_prefix: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
    drivers: Drivers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each watch holds a connection of the client's 100 while its claim binds: past
    CLAIM_WATCHES open at once, a start reads its claim instead. One allowed: two starts one
    after the other both watch (the first gave its watch back); none allowed: both read."""
    counts = []
    for allowed in (1, 0):
        monkeypatch.setattr(resources, "CLAIM_WATCHES", allowed)
        failed: list[str] = []
        driver = drivers(kube_namespace, kube_cluster.kubeconfig, failed)
        await driver.prepare([])
        requests = await requests_of(driver, kube_prefix, tmp_path, 2)
        before = await claim_requests(kube_api)
        for request in requests:
            assert (await driver.create(request, new=True)).status == RunState.RUNNING
        counts.append(await settled(kube_api, before, 2 * allowed))
        assert failed == []
        for request in requests:
            await driver.remove(request.sandbox_id)
    watched, read = counts
    assert watched == {"POST": 2, "GET": 0, "WATCH": 2}, watched
    assert read["POST"] == 2, read
    assert read["WATCH"] == 0, read
    assert read["GET"] >= 2, read


async def test_a_role_without_watch_on_claims_reads_them_instead(
    *,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    kube_prefix: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
    drivers: Drivers,
) -> None:
    """The documented Role as it was before the watch (no `watch` on claims), bound to a
    service account: its starts run, each claim read until bound, the watch asked once."""
    role, binding = documented_rbac()
    for rule in role["rules"]:
        if CLAIMS in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "watch"]
    account_ns = f"cp-{secrets.token_hex(4)}"
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    await core.create_namespace({"metadata": {"name": account_ns}})
    try:
        await wait_service_account(core, account_ns)
        role["metadata"]["namespace"] = binding["metadata"]["namespace"] = kube_namespace
        binding["subjects"][0]["namespace"] = account_ns
        await core.create_namespaced_service_account(account_ns, {"metadata": {"name": ACCOUNT}})
        await rbac.create_namespaced_role(kube_namespace, role)
        await rbac.create_namespaced_role_binding(kube_namespace, binding)
        kubeconfig = await account_kubeconfig(
            kube_api, kube_cluster.kubeconfig, account_ns, tmp_path / "kubeconfig"
        )
        # (The Role reads no storage class: the binding mode is unknown, and a new claim is
        # waited for UNKNOWN_BINDING_WAIT at most.)
        failed: list[str] = []
        driver = drivers(kube_namespace, kubeconfig, failed)
        requests = await requests_of(driver, kube_prefix, tmp_path, 2)
        before = await claim_requests(kube_api)
        first = await driver.create(requests[0], new=True)
        second = await driver.create(requests[1], new=True)
        made = await settled(kube_api, before, 0)
        assert (first.status, second.status) == (RunState.RUNNING, RunState.RUNNING)
        assert made["POST"] == 2, made
        assert made["GET"] >= 1, made  # the claims were read instead
        # Refused (403: not among the API server's answered requests) once, not asked again.
        assert made["WATCH"] == 0, made
        assert failed.count("watch") == 1, failed
        for request in requests:
            await driver.remove(request.sandbox_id)
    finally:
        await core.delete_namespace(account_ns, grace_period_seconds=0)
