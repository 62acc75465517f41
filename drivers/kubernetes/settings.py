"""What a platform team tells the Kubernetes runtime about its cluster (the ACS_KUBE* variables
below; docs/configuration.md lists them, docs/deployment.md says how to choose them)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from drivers.egress import METADATA_V4
from drivers.kubernetes.names import PREFIX_PATTERN
from drivers.runtime import CommaList, KeyValues, RuntimeSettings

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

CLUSTER_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
"""Where a cluster's pods and Services are, when the operator does not say (ACS_KUBE_CLUSTER_
CIDRS): every private range, as no cluster's ranges can be read through its API (v1.20)."""
PRIVATE_RANGES = CLUSTER_RANGES + tuple(
    m
    for m in METADATA_V4
    if not any(ipaddress.IPv4Network(m).subnet_of(ipaddress.IPv4Network(c)) for c in CLUSTER_RANGES)
)
"""What `egress: internet` leaves out by default: the cluster's own networks (pods, Services,
nodes, the API server) and the cloud metadata services are not "the internet"."""
ANY_ADDRESS = "0.0.0.0"  # noqa: S104 (in a pod: its own address, behind a Service)


class KubernetesSettings(RuntimeSettings):
    """Kubernetes"""

    kubeconfig: Path | None = Field(
        default=None,
        description="with `ACS_DRIVER=kubernetes`: the kubeconfig file the control plane "
        "connects with; unset: the in-cluster credentials of the pod it runs in (its service "
        "account, which needs the Role of [deployment](deployment.md#rbac))",
    )
    kube_context: str | None = Field(
        default=None, description="the kubeconfig's context to use; unset: its current context"
    )
    kube_namespace: str = Field(
        default="acs-sandboxes",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="the namespace sandboxes run in (it must exist; the control plane needs "
        "nothing outside it)",
    )
    kube_endpoint: Literal["pod_ip", "service"] = Field(
        default="pod_ip",
        description="how the control plane reaches a sandbox: `pod_ip` (the pod's address: the "
        "control plane must route to the pod network) or `service` (a ClusterIP Service per "
        "sandbox, kept across pause and resume)",
    )
    kube_control_plane_url: str | None = Field(
        default=None,
        description="the control plane as sandboxes reach it (their webhooks; e.g. the "
        "ClusterIP of a Service in front of the webhook listener, `http://10.96.0.50:3001`: "
        "sandboxes of restricted egress get no DNS); unset: "
        "`http://<ACS_KUBE_WEBHOOK_ADDRESS>:<ACS_WEBHOOK_PORT>`",
    )
    kube_webhook_address: str = Field(
        default=ANY_ADDRESS,
        description="the address the webhook listener binds for sandboxes (in a pod, `0.0.0.0`; "
        "outside the cluster, this host's address on a network the pods reach)",
    )
    kube_control_plane_labels: KeyValues = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "acs-control-plane"},
        json_schema_extra={"shown_default": "`app.kubernetes.io/name=acs-control-plane`"},
        description="labels of the control plane's pods (`k=v,…`), which the sandboxes' "
        "NetworkPolicies admit to their ports and let them reach; used when the control plane "
        "runs in the cluster",
    )
    kube_control_plane_namespace: str | None = Field(
        default=None,
        description="the namespace of those pods; unset: the control plane's own, in a pod "
        "(Kubernetes 1.21+ labels namespaces by name, which a policy across namespaces needs)",
    )
    kube_control_plane_cidrs: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated addresses (CIDRs) a control plane outside the cluster "
        "connects from and listens on, for the NetworkPolicies; unset: "
        "`ACS_KUBE_WEBHOOK_ADDRESS/32` when that is an address",
    )
    kube_storage_class: str | None = Field(
        default=None,
        description="the StorageClass of workspace claims; unset: the cluster's default",
    )
    kube_workspace_size: str = Field(
        default="10Gi",
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$",
        description="the size each workspace claim requests",
    )
    kube_snapshot_scratch_size: str = Field(
        default="10Gi",
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$",
        description="the scratch space a snapshot helper pod may use on its node's disk (its "
        "`emptyDir`'s `sizeLimit`), where an export stages the changed files: a snapshot whose "
        "changed files need more is refused with 413 before anything is copied",
    )
    kube_image_registry: str | None = Field(
        default=None,
        description="registry (and path) the specs' images are pulled from, e.g. "
        "`registry.example.com/acs`; an image that names its own registry is left as it is",
    )
    kube_image_pull_secrets: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated Secrets (in the sandbox namespace) pods pull images with",
    )
    kube_image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent",
        description="the pods' imagePullPolicy; `Never` for images loaded onto the nodes "
        "(then an image no node has is missing at once, when nodes may be read)",
    )
    kube_runtime_classes: KeyValues = Field(
        default_factory=dict,
        description="a spec's `runtime` -> the RuntimeClass its pods name (`runsc=gvisor,…`); "
        "a runtime not listed names a RuntimeClass of its own name",
    )
    kube_node_selector: KeyValues = Field(
        default_factory=dict,
        description="node labels sandbox pods are placed by (`k=v,…`), e.g. a pool of sandbox "
        "nodes; admission counts only those nodes",
    )
    kube_cpu_request: float = Field(
        default=0.05,
        gt=0,
        le=256,
        description="CPU cores each sandbox pod requests (its limit is the spec's `cpus`)",
    )
    kube_pause_grace: int = Field(
        default=5,
        ge=0,
        le=3600,
        description="seconds a paused sandbox's processes get between SIGTERM and SIGKILL as "
        "its pod is deleted",
    )
    kube_schedule_timeout: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="seconds a new pod may stay unschedulable before its start fails (longer "
        "with a cluster autoscaler); meanwhile new sandboxes are refused with 429",
    )
    kube_pod_start_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="seconds from a pod's creation to its container running, image pull "
        "included (then `ACS_START_TIMEOUT` for the agent server's `/health`)",
    )
    kube_internet_except: CommaList[str] = Field(
        default_factory=lambda: list(PRIVATE_RANGES),
        description="what `egress: internet` leaves out (CIDRs): by default the private and "
        "link-local ranges, where the cluster's pods, Services, nodes and API server are, and "
        "the cloud metadata services outside them",
    )
    kube_cluster_cidrs: CommaList[str] = Field(
        default_factory=lambda: list(CLUSTER_RANGES),
        description="the cluster's pod and Service ranges (CIDRs), where the control plane never "
        "connects for a user (the LLM gateway: [security](security.md#12-outbound-connections)); "
        "by default every private range, since a cluster does not tell its ranges through its "
        "API: set them to let `ACS_OUTBOUND_ALLOW` admit the rest of your network",
    )
    kube_dns_labels: KeyValues = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        json_schema_extra={"shown_default": "`k8s-app=kube-dns`"},
        description="labels of the cluster DNS pods that sandboxes of `egress: internet` may "
        "query (port 53); empty: no DNS rule",
    )

    @field_validator("kube_control_plane_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "$(" in value:
            # Kubernetes leaves `$(VAR)` as it is when VAR is not set: in the shipped manifests,
            # the acs-webhooks Service did not exist yet when this pod was made.
            raise ValueError(
                f"{value!r} names a variable Kubernetes did not set (a Service's address: does "
                "the Service exist? The pod's restart reads it again)"
            )
        if not re.fullmatch(r"https?://[^/?#\s]+(/[^?#\s]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("kube_control_plane_cidrs", "kube_internet_except", "kube_cluster_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            try:
                out.append(str(ipaddress.IPv4Network(item, strict=False)))
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an IPv4 address or network: {exc}") from None
        return out

    @field_validator("kube_webhook_address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            return str(ipaddress.IPv4Address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address") from None

    def check(self, prefix: str) -> None:
        if not re.fullmatch(PREFIX_PATTERN, prefix):
            raise ValueError(
                "ACS_CONTAINER_PREFIX: with ACS_DRIVER=kubernetes it names pods, claims and "
                "Services: lower-case letters, digits and '-', a letter first, at most 40 "
                f"characters ({prefix!r})"
            )
        if self.kube_control_plane_url is None and self.kube_webhook_address == ANY_ADDRESS:
            raise ValueError(
                "ACS_KUBE_CONTROL_PLANE_URL: with ACS_KUBE_WEBHOOK_ADDRESS=0.0.0.0 sandboxes need "
                "the URL they reach the control plane at (e.g. a Service in front of its webhook "
                "listener)"
            )

    def listener_address(self) -> str | None:
        return self.kube_webhook_address

    def credentials(self) -> Credentials:
        """The control plane's identity: the kubeconfig (and context), else in-cluster."""
        kubeconfig = str(self.kubeconfig) if self.kubeconfig else None
        return Credentials(kubeconfig=kubeconfig, context=self.kube_context)


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
