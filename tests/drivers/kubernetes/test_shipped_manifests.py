"""The Kubernetes manifests we ship (deploy/kubernetes/), rendered by the cluster's own kubectl
(kustomize) and applied to the test cluster: the API server accepts every object of both
variants, stores the hardening as written, and the control plane's service account may manage
sandboxes in the sandbox namespace, read nodes and storage classes, and nothing else.

Pods running is test_deployed_control_plane.py's part: the external-redis variant's control
plane, two replicas, a sandbox and a conversation through it. Not run anywhere here: the Redis
StatefulSet's pods (its image comes from a registry this machine cannot reach, and the Sentinels'
names need a cluster DNS the test cluster lacks), and the NetworkPolicies' effect (the test
cluster's network does not enforce them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.drivers.kubernetes.conftest import BUILD_SCRIPT, REPO, KubeCluster

pytestmark = [pytest.mark.kube, pytest.mark.slow]

MANIFESTS = REPO / "deploy" / "kubernetes"
CONTROL_PLANE = "system:serviceaccount:acs:acs-control-plane"
NAMESPACES = ("acs", "acs-sandboxes")
CLUSTER_RBAC = "acs-control-plane-read-nodes"


class Kubectl:
    def __init__(self, cluster: KubeCluster) -> None:
        bin_dir = subprocess.run(
            [str(BUILD_SCRIPT)], capture_output=True, text=True, check=True, timeout=1800
        ).stdout.strip()
        self.binary = str(Path(bin_dir) / "kubectl")
        self.kubeconfig = str(cluster.kubeconfig)

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def can_i(self, verb: str, resource: str, namespace: str, subresource: str = "") -> bool:
        """As the control plane's service account. (`pods/log` would name a pod called "log".)"""
        extra = ["--subresource", subresource] if subresource else []
        args = ["auth", "can-i", verb, resource, "-n", namespace, "--as", CONTROL_PLANE, *extra]
        return self(*args, check=False).strip() == "yes"


def render(kubectl: Kubectl, tmp_path: Path, variant: str, secrets: dict[str, str]) -> list[Any]:
    """The variant's objects as kustomize renders them, with made-up secrets beside it."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, copy, dirs_exist_ok=True)
    where = copy / variant
    for name, value in secrets.items():
        (where / name).write_text(value)
    return [doc for doc in yaml.safe_load_all(kubectl("kustomize", str(where))) if doc]


def by_kind(docs: list[Any], kind: str, name: str) -> Any:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name))


def uninstall(tool: Kubectl) -> None:
    """Everything the manifests made, gone before the next test applies them again (a namespace
    being deleted refuses objects): no grace for the pods (a control plane's drain would hold
    the namespace's deletion for its 45 s), the cluster-wide RBAC objects too."""
    for namespace in NAMESPACES:
        # The ReplicaSets too: left to the garbage collector, one would make new pods meanwhile.
        tool("delete", "deployment,replicaset,statefulset", "--all", "-n", namespace, check=False)
        tool("delete", "pod", "--all", "-n", namespace, "--force", "--grace-period=0", check=False)
    tool("delete", "namespace", *NAMESPACES, "--ignore-not-found", "--timeout=90s", check=False)
    tool("delete", "clusterrolebinding,clusterrole", CLUSTER_RBAC, "--ignore-not-found",
         check=False)  # fmt: skip


@pytest.fixture
def kubectl(kube_cluster: KubeCluster) -> Any:
    tool = Kubectl(kube_cluster)
    yield tool
    uninstall(tool)


def test_kustomize_refuses_to_render_without_the_secrets(kubectl: Kubectl, tmp_path: Path) -> None:
    """Fail closed: no made-up key or password is ever shipped or generated."""
    shutil.copytree(MANIFESTS, tmp_path / "kubernetes")
    result = subprocess.run(
        [kubectl.binary, "kustomize", str(tmp_path / "kubernetes")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "secret-key" in result.stderr


def test_the_manifests_apply_and_fence_the_control_plane(kubectl: Kubectl, tmp_path: Path) -> None:
    docs = render(
        kubectl,
        tmp_path,
        ".",
        {"secret-key": "k" * 44, "bootstrap-api-key": "b" * 48, "redis-password": "p" * 48},
    )
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("NetworkPolicy") == 3
    assert {"Deployment", "StatefulSet", "Role", "RoleBinding", "Secret", "ServiceAccount"} <= set(
        kinds
    )
    # Kubernetes 1.20 serves PodDisruptionBudget as policy/v1beta1 only; the manifest is
    # policy/v1 (1.21 and later, where v1beta1 is gone from 1.25): checked as rendered.
    pdb = by_kind(docs, "PodDisruptionBudget", "acs-control-plane")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    applied = [d for d in docs if d["kind"] != "PodDisruptionBudget"]
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(applied))

    # RBAC: the sandbox namespace's pods, volumes, services and policies, nothing more; nodes
    # and storage classes read (cluster-wide, read-only).
    for verb, resource in [
        ("create", "pods"),
        ("delete", "pods"),
        ("watch", "pods"),
        ("create", "persistentvolumeclaims"),
        ("patch", "persistentvolumeclaims"),
        ("watch", "persistentvolumeclaims"),  # a new claim is waited for until bound
        ("delete", "services"),
        ("create", "networkpolicies.networking.k8s.io"),
    ]:
        assert kubectl.can_i(verb, resource, "acs-sandboxes"), (verb, resource)
    assert kubectl.can_i("list", "nodes", "default")
    assert kubectl.can_i("get", "storageclasses.storage.k8s.io", "default")
    assert not kubectl.can_i("patch", "nodes", "default")
    assert not kubectl.can_i("get", "pods", "acs-sandboxes", subresource="log")
    # Exec serves snapshots (helper pods, holding a sandbox still): in the sandbox namespace only.
    assert kubectl.can_i("create", "pods", "acs-sandboxes", subresource="exec")
    assert not kubectl.can_i("create", "pods", "acs", subresource="exec")
    assert not kubectl.can_i("get", "secrets", "acs-sandboxes")
    for namespace in ("acs", "default", "kube-system"):
        assert not kubectl.can_i("create", "pods", namespace), namespace
    assert not kubectl.can_i("create", "namespaces", "default")

    # What the API server stored: replicas, probes, the hardening, the Secret's references.
    stored = json.loads(
        kubectl("get", "deployment", "acs-control-plane", "-n", "acs", "-o", "json")
    )
    spec = stored["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert stored["spec"]["replicas"] == 3
    assert spec["serviceAccountName"] == "acs-control-plane"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    secret_refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in container["env"]
        if "valueFrom" in e
    }
    secret_name = by_kind(docs, "Secret", "acs-secrets")["metadata"]["name"]
    assert set(secret_refs) == {"ACS_SECRET_KEY", "ACS_BOOTSTRAP_API_KEY", "ACS_REDIS_PASSWORD"}
    assert set(secret_refs.values()) == {secret_name}
    values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert values == {  # the webhook Service's address, as Kubernetes tells the pod
        "ACS_KUBE_CONTROL_PLANE_URL": "http://$(ACS_WEBHOOKS_SERVICE_HOST):$(ACS_WEBHOOKS_SERVICE_PORT)"
    }
    assert spec["terminationGracePeriodSeconds"] >= 6 + 30  # drain delay + shutdown timeout
    stored_secret = json.loads(kubectl("get", "secret", secret_name, "-n", "acs", "-o", "json"))
    assert set(stored_secret["data"]) == {"secret-key", "bootstrap-api-key", "redis-password"}

    # The sandbox namespace is deny-all but for the control plane, both ways.
    policies = json.loads(kubectl("get", "networkpolicy", "-n", "acs-sandboxes", "-o", "json"))
    deny = next(p for p in policies["items"] if p["metadata"]["name"] == "default-deny")
    assert deny["spec"]["podSelector"] == {}
    assert sorted(deny["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in deny["spec"]
    assert "egress" not in deny["spec"]
    sandbox_ns = json.loads(kubectl("get", "namespace", "acs-sandboxes", "-o", "json"))
    assert sandbox_ns["metadata"]["labels"]["acs.io/role"] == "sandboxes"

    # The Redis StatefulSet: 3 pods with a volume each, the Sentinels' addresses in the config.
    redis = json.loads(kubectl("get", "statefulset", "acs-redis", "-n", "acs", "-o", "json"))
    assert redis["spec"]["replicas"] == 3
    assert [c["name"] for c in redis["spec"]["template"]["spec"]["containers"]] == [
        "redis",
        "sentinel",
    ]
    config = json.loads(kubectl("get", "configmap", "acs-config", "-n", "acs", "-o", "json"))
    sentinels = config["data"]["ACS_REDIS_SENTINELS"].split(",")
    assert sentinels == [f"acs-redis-{n}.acs-redis.acs.svc.cluster.local:26379" for n in range(3)]


def test_the_external_redis_variant_swaps_sentinel_for_a_url(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    docs = render(
        kubectl,
        tmp_path,
        "external-redis",
        {"secret-key": "k" * 44, "bootstrap-api-key": "b" * 48, "redis-url": "redis://r:6379/0"},
    )
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = by_kind(docs, "Deployment", "acs-control-plane")["spec"]["template"]["spec"][
        "containers"
    ]
    names = [e["name"] for e in container["env"]]
    assert "ACS_REDIS_URL" in names
    assert "ACS_REDIS_PASSWORD" not in names
    assert by_kind(docs, "ConfigMap", "acs-config")["data"]["ACS_REDIS_SENTINELS"] == ""
    # The API server accepts every object of the variant (PodDisruptionBudget aside, as above).
    applied = [d for d in docs if d["kind"] != "PodDisruptionBudget"]
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(applied))
    stored = json.loads(
        kubectl("get", "deployment", "acs-control-plane", "-n", "acs", "-o", "json")
    )
    (container,) = stored["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in container["env"]] == names
