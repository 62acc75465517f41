"""Finding 8 of issue 26 (its first half): the sandbox namespace carries
`pod-security.kubernetes.io/enforce: restricted`, and every pod the Kubernetes driver makes fits
the Restricted profile, read from the published Pod Security Standards (tests/support/
pod_security.py). Kubernetes 1.25+ enforces the label itself; the project's test cluster (1.20)
has no Pod Security Admission, so tests/drivers/kubernetes/test_pod_security_live.py checks the
live pods, as the API server stored them, against the same rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from drivers.base import NetworkPolicy, SandboxRequest
from drivers.kubernetes.objects import pod_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.support.pod_security import profile, violations

REPO = Path(__file__).resolve().parents[2]
ENFORCED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _request(**overrides: Any) -> SandboxRequest:
    values: dict[str, Any] = {
        "sandbox_id": "01abc",
        "owner": "alice@example.com",
        "spec_id": "default",
        "image": "acs-sandbox-default:latest",
        "command": ["/opt/agent/bin/python", "-m", "agent"],
        "env": {"A": "1"},
        "working_dir": "/workspace",
        "ports": [8000, 9000],
        "cpus": 1.0,
        "memory_bytes": 1 << 30,
        "memory_reservation": 64 << 20,
        "pids": 512,
        "network": NetworkPolicy("default", None),
        "user": "1000:1000",
    }
    return SandboxRequest(**(values | overrides))


PODS = {
    "the default spec": (_request(), KubernetesSettings(), None),
    "the image's own USER": (_request(user=None), KubernetesSettings(), None),
    "a read-only root with tmpfs and kept state": (
        _request(
            read_only=True,
            tmpfs={"/tmp": "size=64m", "/home/agent": "", "/var/lib/acs-agent": ""},
            kept_paths=("/var/lib/acs-agent",),
        ),
        KubernetesSettings(),
        None,
    ),
    "gVisor, a registry, pull secrets, a node selector": (
        _request(),
        KubernetesSettings(
            kube_image_registry="registry.example.com/acs",
            kube_image_pull_secrets=["regcred"],
            kube_node_selector={"pool": "sandboxes"},
        ),
        "gvisor",
    ),
}


@pytest.mark.parametrize("case", list(PODS))
def test_the_drivers_pods_fit_the_restricted_profile(case: str) -> None:
    request, options, runtime = PODS[case]
    aliases = [{"ip": "10.0.0.1", "hostnames": ["host.docker.internal"]}]
    pod = pod_manifest(request, options, "acs-", aliases=aliases, runtime_class=runtime)
    assert violations(pod, profile("restricted")) == []


def test_the_rules_are_read_and_not_blind() -> None:
    """Every control of both tables is read, and each known way out of the profile is caught."""
    restricted = profile("restricted")
    controls = {rule.control for rule in restricted}
    assert {"Host Namespaces", "Capabilities", "HostPath Volumes", "Volume Types"} <= controls
    assert {"Running as Non-root", "Seccomp (v1.19+)", "Capabilities (v1.22+)"} <= controls
    assert len(controls) == 18, controls  # 12 Baseline controls, 6 more in Restricted
    assert all(rule.fields and (rule.allowed or rule.one_of) for rule in restricted)
    good = pod_manifest(_request(), KubernetesSettings(), "acs-", aliases=[], runtime_class=None)

    def broken(change: Any) -> dict[str, Any]:
        pod = copy.deepcopy(good)
        change(pod["spec"], pod["spec"]["containers"][0]["securityContext"])
        return pod

    escapes = {
        "privileged": lambda s, c: c.update(privileged=True),
        "host network": lambda s, c: s.update(hostNetwork=True),
        "a capability added": lambda s, c: c["capabilities"].update(add=["SYS_ADMIN"]),
        "ALL not dropped": lambda s, c: c["capabilities"].update(drop=["NET_RAW"]),
        "escalation allowed": lambda s, c: c.update(allowPrivilegeEscalation=True),
        "root": lambda s, c: (c.update(runAsUser=0), s["securityContext"].update(runAsUser=0)),
        "non-root not required": lambda s, c: (
            c.pop("runAsNonRoot"),
            s["securityContext"].pop("runAsNonRoot"),
        ),
        "no seccomp": lambda s, c: s["securityContext"].pop("seccompProfile"),
        "seccomp unconfined": lambda s, c: s["securityContext"].update(
            seccompProfile={"type": "Unconfined"}
        ),
        "a host path": lambda s, c: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "a host port": lambda s, c: s["containers"][0]["ports"][0].update(hostPort=80),
        "an unsafe sysctl": lambda s, c: s["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]
        ),
    }
    for name, change in escapes.items():
        assert violations(broken(change), restricted), name
    assert violations(broken(escapes["ALL not dropped"]), profile("baseline")) == []


def _namespaces() -> dict[str, dict[str, Any]]:
    path = REPO / "deploy" / "kubernetes" / "base" / "namespaces.yaml"
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_the_sandbox_namespace_enforces_the_restricted_profile() -> None:
    labels = _namespaces()["acs-sandboxes"]["metadata"]["labels"]
    assert {k: labels.get(k) for k in ENFORCED} == ENFORCED
    assert labels.get("pod-security.kubernetes.io/warn") == "restricted"
    assert labels.get("pod-security.kubernetes.io/audit") == "restricted"
