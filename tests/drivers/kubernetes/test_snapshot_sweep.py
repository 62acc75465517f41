"""The sweep of snapshot helper pods on the test cluster (drivers/kubernetes/files.py: sweep): a
helper pod whose control plane was killed mid-export is never deleted by it; once the pod has
ended (its activeDeadlineSeconds, which ends it without the control plane) the runtime's sweep
removes it, while a helper that still runs (another replica's, at work) is left alone."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from controlplane import keys
from drivers.kubernetes.names import LABEL_FILES, claim_name, helper_name, label_value
from drivers.kubernetes.objects import helper_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.support.sandbox_helpers import DEFAULT_IMAGE, start_running
from tests.support.types import Client

pytestmark = [pytest.mark.kube, pytest.mark.slow]
Headers = Callable[..., Awaitable[dict[str, str]]]


def left_helper(kube_overrides: dict[str, Any], sandbox_id: str, deadline: int) -> dict[str, Any]:
    """A helper pod exactly as the driver makes one for an export of `sandbox_id`, which its
    control plane (killed) never deleted; `deadline`: its activeDeadlineSeconds."""
    prefix = kube_overrides["container_prefix"]
    fields = KubernetesSettings.model_fields
    settings = KubernetesSettings(**{k: v for k, v in kube_overrides.items() if k in fields})
    manifest = helper_manifest(
        helper_name(prefix, secrets.token_hex(6)),
        claim_name(prefix, sandbox_id),
        settings,
        prefix,
        image=DEFAULT_IMAGE,
        run_as=(1000, 1000),
        node=None,
        read_only=True,
    )
    manifest["spec"]["activeDeadlineSeconds"] = deadline
    return manifest


async def phase(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        pod = await core.read_namespaced_pod(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str(pod.status.phase)


async def wait_phase(
    core: client.CoreV1Api, namespace: str, name: str, phases: set[str], within: float
) -> None:
    deadline = time.monotonic() + within
    seen = None
    while time.monotonic() < deadline:
        seen = await phase(core, namespace, name)
        if seen in phases:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"helper {name} is {seen}, not {phases}, after {within} s")


async def test_the_sweep_removes_a_helper_left_by_a_killed_control_plane(
    snap_kube: Client,
    kube_overrides: dict[str, Any],
    kube_api: client.ApiClient,
    user_headers: Headers,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    core = client.CoreV1Api(kube_api)
    sandbox = await start_running(snap_kube, await user_headers("alice"), within=120)

    left = left_helper(kube_overrides, sandbox["id"], deadline=3)
    working = left_helper(kube_overrides, sandbox["id"], deadline=600)
    for manifest in (left, working):
        await core.create_namespaced_pod(ns, manifest)
    left_name, working_name = left["metadata"]["name"], working["metadata"]["name"]
    assert left["metadata"]["labels"][LABEL_FILES] == label_value(prefix)
    try:
        # The deadline ends the left one (nobody runs the helper program in it any more).
        await wait_phase(core, ns, left_name, {"Failed", "Succeeded"}, within=120)
        await wait_phase(core, ns, working_name, {"Running"}, within=120)

        files = snap_kube.app[keys.DRIVER].files
        assert files is not None
        removed = await files.sweep(0.0)

        assert removed == 1
        for _ in range(60):
            if await phase(core, ns, left_name) is None:
                break
            await asyncio.sleep(0.5)
        assert await phase(core, ns, left_name) is None, "the ended helper is still there"
        # A running helper younger than its deadline may be another replica's: kept.
        assert await phase(core, ns, working_name) == "Running"
    finally:
        for name in (left_name, working_name):
            try:
                await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
