"""The sandbox namespace's Pod Security labels on the test cluster, and the driver's pods as the
API server stored them (defaults applied) against the Restricted profile of the published Pod
Security Standards (tests/support/pod_security.py).

What this proves and what it cannot: the cluster is Kubernetes 1.20, which has no Pod Security
Admission (alpha in 1.22, GA in 1.25), so the labels are stored but nothing enforces them here;
what is proven is that the namespace carries them, that pods are created and run in it, and
that every field of those pods, after the API server's defaulting, fits each Restricted rule,
which is what the admission controller of 1.25+ checks (docs/security.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.drivers.kubernetes.sandbox_objects import objects
from tests.support.pod_security import profile, violations
from tests.support.sandbox_helpers import start, wait_status
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]
Headers = Callable[..., Awaitable[dict[str, str]]]


async def test_sandbox_pods_fit_the_restricted_profile_in_a_labelled_namespace(
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    namespace = await client.CoreV1Api(kube_api).read_namespace(ns)
    assert namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    api = await make_client(with_sandboxes=True, **kube_overrides)
    alice = await user_headers("alice")
    sandbox_id = (await start(api, alice))["id"]
    await wait_status(api, alice, sandbox_id, "RUNNING", within=90)
    pod = (await objects(kube_api, ns, prefix)).pod(sandbox_id)
    assert pod["status"]["phase"] == "Running"
    assert violations(pod, profile("restricted")) == []
