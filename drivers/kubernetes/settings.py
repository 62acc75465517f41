"""What a platform team tells the Kubernetes driver about its cluster (controlplane/config.py reads
them from the ACS_KUBE_* variables; docs/configuration.md lists them, docs/deployment.md says how
to choose them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Endpoint = Literal["pod_ip", "service"]
PullPolicy = Literal["IfNotPresent", "Always", "Never"]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

PRIVATE_RANGES = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
)
"""What `egress: internet` leaves out by default: the cluster's own networks (pods, Services,
nodes, the API server) and the cloud metadata service are not "the internet"."""


@dataclass(frozen=True)
class KubeOptions:
    namespace: str = "acs-sandboxes"
    endpoint: Endpoint = "pod_ip"
    """How the control plane reaches a sandbox: its pod's IP, or a ClusterIP Service of its own
    (stable across pause and resume; a control plane outside the cluster needs a route to the
    Service range)."""
    control_plane_url: str | None = None
    """The control plane as sandboxes reach it (webhooks, the LLM gateway); None: the webhook
    listener at http://<webhook_address>:<its port>."""
    webhook_address: str = "0.0.0.0"  # noqa: S104 (in a pod: its own address, behind a Service)
    """Where the driver binds the webhook listener for sandboxes."""
    control_plane_labels: dict[str, str] = field(default_factory=dict)
    """The control plane's pods (in `control_plane_namespace`), for the NetworkPolicies; empty
    or no namespace: none in the cluster."""
    control_plane_namespace: str | None = None
    control_plane_cidrs: tuple[str, ...] = ()
    """Addresses of a control plane outside the cluster (for the NetworkPolicies)."""
    host_ports: tuple[int, ...] = ()
    """Ports of the control plane's host every sandbox may reach too (ACS_SANDBOX_HOST_PORTS)."""
    storage_class: str | None = None
    workspace_size: str = "10Gi"
    image_registry: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: PullPolicy = "IfNotPresent"
    runtime_classes: dict[str, str] = field(default_factory=dict)
    """A spec's `runtime` -> the RuntimeClass its pods name (unlisted: the runtime's own name)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    cpu_request: float = 0.05
    pause_grace: int = 5
    """Seconds between SIGTERM and SIGKILL when a sandbox's pod is deleted by a pause."""
    schedule_timeout: float = 15.0
    """Seconds a sandbox's pod may stay unschedulable before its start fails."""
    start_timeout: float = 120.0
    """Seconds from a pod's creation to its container running (image pull included)."""
    internet_except: tuple[str, ...] = PRIVATE_RANGES
    dns_labels: dict[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    """The cluster DNS pods (any namespace), which sandboxes of `egress: internet` may ask;
    empty: no DNS rule."""


@dataclass(frozen=True)
class Credentials:
    """Where the control plane's identity comes from: a kubeconfig file (and context), else the
    pod's service account (in-cluster). `service_account` and `environ` are for tests."""

    kubeconfig: str | None = None
    context: str | None = None
    service_account: Path = SERVICE_ACCOUNT
    environ: dict[str, str] | None = None

    def in_cluster_namespace(self) -> str | None:
        """The namespace the control plane's own pod runs in (in-cluster only)."""
        if self.kubeconfig is not None:
            return None
        try:
            return (self.service_account / "namespace").read_text().strip() or None
        except OSError:
            return None
