"""The driver contract (tests/drivers/contract.py) with the Kubernetes driver, on the project's
test cluster: the same tests, run against pods, claims and NetworkPolicies through the interface
alone, the control plane (this process) outside the cluster as in the other kube tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.sandboxes.webhook_listener import WebhookListener
from drivers.base import SandboxDriver
from drivers.kubernetes.driver import KubernetesDriver
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.contract import *  # noqa: F403 (the shared tests, with the fixtures below)
from tests.drivers.contract import Hooks
from tests.drivers.kubernetes.conftest import KubeCluster
from tests.support.sandbox_helpers import DEFAULT_IMAGE

pytestmark = [pytest.mark.kube, pytest.mark.slow]


# `test_prefix` and `driver`: the runtime's side of the shared contract tests, defined here on
# purpose (the documented exception of tests/test_fixture_names.py): `test_prefix` replaces the
# Docker fixtures' own, whose clean-up is of Docker objects.
@pytest.fixture
def test_prefix(kube_prefix: str) -> str:
    """The contract's deployment prefix, without the Docker fixtures' clean-up (the namespace
    goes after the test)."""
    return kube_prefix


@pytest.fixture
async def driver(
    kube_cluster: KubeCluster, kube_namespace: str, test_prefix: str, hooks: Hooks
) -> AsyncIterator[SandboxDriver]:
    listener = WebhookListener(0)
    listener.attach(hooks.app)
    settings = KubernetesSettings(
        kubeconfig=kube_cluster.kubeconfig,
        kube_namespace=kube_namespace,
        kube_webhook_address=kube_cluster.host_address,
        kube_image_pull_policy="Never",
        kube_storage_class=kube_cluster.storage_class,
        kube_pod_start_timeout=60.0,
    )
    # Snapshot helpers run the sandbox image, on the nodes already (a deployment runs acs-base).
    made = KubernetesDriver(
        settings, prefix=test_prefix, listener=listener, helper_image=DEFAULT_IMAGE
    )
    yield made
    await made.close()
    await listener.close()


# Replaces the shared test of that name: this runtime cannot show what it checks.
async def test_egress_none_admits_the_webhook_listener_alone() -> None:  # type: ignore[no-redef]
    pytest.skip(
        "the test cluster's network enforces no NetworkPolicy (no policy-aware CNI); "
        "tests/drivers/kubernetes/test_policies.py checks the policy objects the driver makes"
    )
