"""The snapshot helper's bounds on the test cluster: its scratch space (an emptyDir on the node's
disk) carries a sizeLimit from ACS_KUBE_SNAPSHOT_SCRATCH_SIZE, and a workspace whose changed
files need more is refused with a clear 413 before anything is staged; a workspace the agent
nests thousands of directories deep (a command in its sandbox, as its user) is refused with a
clear 413 instead of ending the helper. Each time nothing is listed, the sandbox goes on, and
once the workspace is back within bounds the same sandbox snapshots as usual."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from drivers.files_helper import MAX_DEPTH
from drivers.kubernetes.objects import helper_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.kubernetes.test_sandboxes import run
from tests.support.sandbox_helpers import DEFAULT_IMAGE, start_running
from tests.support.snapshot_helpers import snapshot
from tests.support.types import Client, ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]
Headers = Callable[..., Awaitable[dict[str, str]]]
SCRATCH = "2Mi"


@pytest.fixture
async def small_scratch(
    make_client: ClientFactory, kube_overrides: dict[str, Any], snapshot_settings: dict[str, Any]
) -> Client:
    """Sandboxes on the cluster, snapshots in the test's registry, helpers with 2 MiB of
    scratch space (the helper image: the sandbox image, on the nodes already)."""
    return await make_client(
        with_sandboxes=True,
        **kube_overrides,
        **snapshot_settings,
        snapshot_helper_image=DEFAULT_IMAGE,
        kube_snapshot_scratch_size=SCRATCH,
    )


async def test_the_helpers_scratch_space_is_bounded_on_the_cluster(
    kube_overrides: dict[str, Any], kube_api: client.ApiClient
) -> None:
    """The manifest the driver sends, as the API server keeps it (admitted under the
    namespace's Restricted profile): the scratch emptyDir has its sizeLimit."""
    ns = kube_overrides["kube_namespace"]
    settings = KubernetesSettings(
        kube_control_plane_url="http://10.0.0.1:3001", kube_snapshot_scratch_size=SCRATCH
    )
    manifest = helper_manifest(
        "acs-files-limits",
        "acs-none-workspace",  # never bound: the pod waits, which is all this reads
        settings,
        kube_overrides["container_prefix"],
        image=DEFAULT_IMAGE,
        run_as=(1000, 1000),
        node=None,
        read_only=True,
    )
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_pod(ns, manifest)
    try:
        pod = await core.read_namespaced_pod("acs-files-limits", ns)
        volumes = {volume.name: volume for volume in pod.spec.volumes}
        assert volumes["work"].empty_dir.size_limit == SCRATCH
    finally:
        await core.delete_namespaced_pod("acs-files-limits", ns, grace_period_seconds=0)


NEST = (
    "nohup python3 -c '\n"
    "import os\n"
    'os.chdir("/workspace")\n'
    "for _ in range(5000):\n"
    '    os.mkdir("d")\n'
    '    os.chdir("d")\n'
    'open("/workspace/nested", "w").close()\n'
    "' >/dev/null 2>&1 &"
)
"""5000 directories, each in the last (past PATH_MAX and Python's recursion limit); then a mark."""


async def refused(api: Client, headers: dict[str, str], sandbox_id: str) -> str:
    """A snapshot of the sandbox, refused with 413: its detail; nothing listed."""
    resp = await api.post(f"/api/v1/sandboxes/{sandbox_id}/snapshots", json={}, headers=headers)
    body = await resp.json()
    assert resp.status == 413, body
    page = await (await api.get("/api/v1/snapshots/search", headers=headers)).json()
    assert page["items"] == []
    state = await (await api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=headers)).json()
    assert state["status"] == "RUNNING", state
    return str(body["detail"])


async def test_a_workspace_over_the_scratch_space_or_nested_too_deep_is_refused(
    small_scratch: Client, user_headers: Headers
) -> None:
    api = small_scratch
    alice = await user_headers("alice")
    source = await start_running(api, alice, within=90)

    await run(source, "head -c 3000000 /dev/urandom > /workspace/blob")
    detail = await refused(api, alice, source["id"])
    assert "ACS_KUBE_SNAPSHOT_SCRATCH_SIZE" in detail, detail
    assert f"({2 * 1024 * 1024} bytes" in detail, detail
    await run(source, "rm /workspace/blob")

    await run(source, NEST)
    deadline = time.monotonic() + 120
    while (await run(source, "test -e /workspace/nested && echo y || true"))["stdout"] != "y\n":
        assert time.monotonic() < deadline, "the agent's nesting never finished"
        await asyncio.sleep(0.5)
    detail = await refused(api, alice, source["id"])
    assert f"nested more than {MAX_DEPTH} levels deep (d/d/d/" in detail, detail
    # Each command has 10 s in the agent: on a loaded host the removal of 5,000 levels takes
    # more, so it is repeated (each goes on where the last was stopped) until the tree is gone.
    deadline = time.monotonic() + 120
    removal = "rm -rf /workspace/d; test -e /workspace/d && echo y || true"
    while (await run(source, removal))["stdout"] == "y\n":
        assert time.monotonic() < deadline, "the nested tree was never removed"

    # Within bounds again: the same sandbox snapshots, the helper's alive, the agent answers.
    taken = await snapshot(api, alice, source["id"])
    assert taken["sandbox_id"] == source["id"]
    assert (await run(source, "echo alive"))["stdout"].strip() == "alive"
