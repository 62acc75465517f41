"""The RBAC docs/deployment.md gives a platform team is all the control plane needs: a service
account bound to exactly the Role and RoleBinding read from that page (in the sandbox namespace,
nothing cluster-wide) runs sandboxes through their whole lifecycle, and may do nothing else."""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml
from kubernetes_asyncio import client

from tests.drivers.kubernetes.conftest import REPO, api_client, wait_service_account
from tests.drivers.kubernetes.sandbox_objects import eventually, objects, orphans
from tests.drivers.kubernetes.test_sandboxes import Headers, run
from tests.drivers.kubernetes.test_snapshots import start_running_from
from tests.support.sandbox_helpers import DEFAULT_IMAGE, start_running, wait_status
from tests.support.snapshot_helpers import snapshot
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]

DOC = REPO / "docs" / "deployment.md"
ACCOUNT = "acs-control-plane"


def documented_rbac() -> list[dict[str, Any]]:
    """The Role and RoleBinding of docs/deployment.md ("RBAC")."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "kind: Role\n" in b]
    return list(yaml.safe_load_all(block))


@pytest.fixture
async def account_namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """The control plane's own namespace, where its service account lives."""
    core = client.CoreV1Api(kube_api)
    name = f"cp-{secrets.token_hex(4)}"
    await core.create_namespace({"metadata": {"name": name}})
    await wait_service_account(core, name)
    yield name
    await core.delete_namespace(name, grace_period_seconds=0)


async def account_kubeconfig(
    kube_api: client.ApiClient, cluster_config: Path, namespace: str, target: Path
) -> Path:
    """A kubeconfig whose user is the service account ACCOUNT of `namespace` (its token)."""
    core = client.CoreV1Api(kube_api)

    async def token_secret() -> str | None:
        account = await core.read_namespaced_service_account(ACCOUNT, namespace)
        return account.secrets[0].name if account.secrets else None

    secret_name = await eventually(token_secret, 30, "the service account's token")
    secret = await core.read_namespaced_secret(secret_name, namespace)
    token = base64.b64decode(secret.data["token"]).decode()
    return write_kubeconfig(cluster_config, token, target)


def write_kubeconfig(cluster_config: Path, token: str, target: Path) -> Path:
    """The cluster of `cluster_config`, the user of `token`."""
    admin = json.loads(cluster_config.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [
            {
                "name": ACCOUNT,
                "context": {"cluster": admin["clusters"][0]["name"], "user": ACCOUNT},
            }
        ],
        "current-context": ACCOUNT,
    }
    target.write_text(json.dumps(config))
    target.chmod(0o600)
    return target


async def status_of(api: client.ApiClient, path: str) -> int:
    response = await api.call_api(
        path,
        "GET",
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    await response.read()
    return int(response.status)


async def test_the_documented_role_is_all_the_control_plane_needs(
    *,
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    kube_api: client.ApiClient,
    account_namespace: str,
    user_headers: Headers,
    raw_redis: aioredis.Redis,
    tmp_path: Path,
    snapshot_settings: dict[str, Any],
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    role, binding = documented_rbac()
    assert role["kind"] == "Role"
    assert binding["kind"] == "RoleBinding"
    role["metadata"]["namespace"] = binding["metadata"]["namespace"] = ns
    (subject,) = binding["subjects"]
    assert subject["name"] == ACCOUNT
    subject["namespace"] = account_namespace
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    await core.create_namespaced_service_account(account_namespace, {"metadata": {"name": ACCOUNT}})
    await rbac.create_namespaced_role(ns, role)
    await rbac.create_namespaced_role_binding(ns, binding)
    kubeconfig = await account_kubeconfig(
        kube_api, kube_overrides["kubeconfig"], account_namespace, tmp_path / "kubeconfig"
    )

    # The account may do nothing outside the sandbox namespace.
    async with await api_client(kubeconfig) as limited:
        assert await status_of(limited, f"/api/v1/namespaces/{ns}/pods") == 200
        for path in (
            "/api/v1/nodes",
            f"/api/v1/namespaces/{account_namespace}/pods",
            "/api/v1/namespaces/default/pods",
            f"/api/v1/namespaces/{ns}/secrets",
            "/apis/storage.k8s.io/v1/storageclasses",
        ):
            assert await status_of(limited, path) == 403, path

    api = await make_client(
        with_sandboxes=True,
        **(kube_overrides | {"kubeconfig": kubeconfig}),
        **snapshot_settings,
        snapshot_helper_image=DEFAULT_IMAGE,  # on the nodes already (a deployment: acs-base)
    )
    alice = await user_headers("alice")
    running = await start_running(api, alice, within=60)
    sandbox_id = running["id"]
    await run(running, "echo kept > /workspace/mark")
    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)).status == 200
    assert (await api.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)).status == 200
    resumed = await wait_status(api, alice, sandbox_id, "RUNNING", within=60)
    read = await run(resumed, "cat /workspace/mark")
    assert read["stdout"].strip() == "kept", read
    # Snapshots through exec (helper pods, the hold), with the Role's pods/exec alone.
    taken = await snapshot(api, alice, sandbox_id)
    assert taken["held_still_seconds"] > 0, taken
    restored = await start_running_from(api, alice, taken["id"])
    read = await run(restored, "cat /workspace/mark")
    assert read["stdout"].strip() == "kept", read
    assert (await api.delete(f"/api/v1/sandboxes/{restored['id']}", headers=alice)).status == 200
    assert await orphans(kube_api, ns, prefix, raw_redis, "pod_ip") == []
    assert (await api.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200
    assert (await objects(kube_api, ns, prefix)).sandbox_ids() == set()
