"""Just enough of a Kubernetes client, over the standard library, for bring-up: readiness, nodes,
the StorageClass, the nodes' pod CIDRs, the default service account."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any

from kubecluster.host import ClusterError
from kubecluster.layout import API_PORT, STORAGE_CLASS, Layout


class Api:
    """Just enough of a Kubernetes client for bring-up (admin identity)."""

    def __init__(self, layout: Layout) -> None:
        pki = layout.state_dir / "pki"
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.host = layout.api_ip

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        connection = http.client.HTTPSConnection(
            self.host, API_PORT, context=self.context, timeout=5
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": content_type} if payload is not None else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        if status != 200:
            raise ClusterError(f"GET {path}: {status} {body}")
        return body

    def ready(self) -> bool:
        status, _ = self.request("GET", "/readyz")
        return status == 200


def node_conditions(api: Api) -> dict[str, dict[str, str]]:
    nodes = api.get("/api/v1/nodes")["items"]
    return {
        node["metadata"]["name"]: {
            c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])
        }
        for node in nodes
    }


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        # The in-tree hostPath provisioner (patched: scripts/kube/patches/04): every node sees
        # the host's file system, so a volume follows its pod to any node.
        "provisioner": "kubernetes.io/host-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def bootstrap_objects(layout: Layout, api: Api) -> None:
    status, body = api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", storage_class())
    if status not in (201, 409):
        raise ClusterError(f"creating the StorageClass failed: {status} {body}")


def set_pod_cidrs(layout: Layout, api: Api) -> None:
    """Record each node's pod CIDR (its dockerd's bridge) on the Node object, for clients that
    read spec.podCIDR; the controller manager does not allocate them here."""
    for index in layout.node_indexes():
        cidr = layout.pod_cidr(index)
        status, body = api.request(
            "PATCH",
            f"/api/v1/nodes/{layout.node_name(index)}",
            {"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}},
            content_type="application/merge-patch+json",
        )
        if status != 200:
            raise ClusterError(
                f"setting the pod CIDR of {layout.node_name(index)}: {status} {body}"
            )


def default_service_account_ready(api: Api) -> bool:
    """Pods can be created in `default` once its service account has its token secret."""
    status, body = api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
    return status == 200 and bool(body.get("secrets"))
