"""The Kubernetes driver's translations, which need no cluster: a request into the pod a
production cluster gets (images from the registry, pull secrets, node selector), owners that are
no label values, and pod states that the test cluster cannot produce on demand (OOMKilled, an
image that cannot be pulled, no node with room) into the reason a user reads. The cluster itself
is exercised by tests/drivers/kubernetes/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet

from controlplane.config import ConfigError, load_config
from drivers.base import NetworkPolicy, RunState, SandboxRequest
from drivers.kubernetes.names import label_value, labels, selector
from drivers.kubernetes.objects import image_reference, pod_manifest
from drivers.kubernetes.settings import KubernetesSettings
from drivers.kubernetes.state import capacity_verdict, state_of

REPO = Path(__file__).resolve().parents[3]


def request(**overrides: Any) -> SandboxRequest:
    values: dict[str, Any] = {
        "sandbox_id": "01abc",
        "owner": "alice@example.com",
        "spec_id": "default",
        "image": "acs-sandbox-default:latest",
        "command": ["/opt/agent/bin/python", "-m", "agent"],
        "env": {"A": "1"},
        "working_dir": "/workspace",
        "ports": [8000],
        "cpus": 1.0,
        "memory_bytes": 1 << 30,
        "memory_reservation": 64 << 20,
        "pids": 512,
        "network": NetworkPolicy("default", None),
        "user": "1000",
    }
    values.update(overrides)
    return SandboxRequest(**values)


def test_images_come_from_the_configured_registry_with_pull_secrets() -> None:
    options = KubernetesSettings(
        kube_image_registry="registry.example.com/acs/",
        kube_image_pull_secrets=["regcred"],
        kube_image_pull_policy="Always",
        kube_node_selector={"pool": "sandboxes"},
    )
    pod = pod_manifest(request(), options, "acs-", aliases=[], runtime_class=None)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.example.com/acs/acs-sandbox-default:latest"
    assert container["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["nodeSelector"] == {"pool": "sandboxes"}
    # An image naming a registry of its own is pulled from there.
    assert image_reference("ghcr.io/org/img:1", "registry.example.com") == "ghcr.io/org/img:1"
    assert image_reference("localhost/img:1", "registry.example.com") == "localhost/img:1"
    assert image_reference("org/img:1", "registry.example.com") == "registry.example.com/org/img:1"
    assert image_reference("img:1", None) == "img:1"


def test_owners_that_are_no_label_values_get_distinct_stand_ins() -> None:
    made = labels("acs-", "01abc", "alice@example.com", "default")
    assert made["acs/owner"] != "alice@example.com"
    assert made["acs/owner"].startswith("alice_example.com-")
    assert label_value("alice@example.com") != label_value("alice@example.org")
    assert label_value("~pool").startswith("pool-")
    assert label_value("bob") == "bob"
    # A prefix ends with "-", which no label value may: it is labelled by its stand-in too.
    assert made["acs/prefix"] != "acs-"
    assert made["acs/prefix"].startswith("acs-")
    expected = f"acs/prefix={made['acs/prefix']},acs/owner={made['acs/owner']}"
    assert selector("acs-", "alice@example.com") == expected


def pod(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    made = pod_manifest(request(), KubernetesSettings(), "acs-", aliases=[], runtime_class=None)
    made["spec"].update(spec)
    made["status"] = status
    return made


def test_an_oom_killed_sandbox_is_dead_with_its_limit_named() -> None:
    terminated = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    state = state_of(
        pod({"phase": "Failed", "containerStatuses": [{"state": terminated}]}), "10.0.0.5"
    )
    assert state.status == RunState.DEAD
    assert state.oom_killed is True
    assert state.error is not None
    assert "out of memory" in state.error
    assert str(1 << 30) in state.error  # the limit it ran into


def test_an_image_that_cannot_be_pulled_says_so() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}
    state = state_of(pod({"phase": "Pending", "containerStatuses": [{"state": waiting}]}), None)
    assert state.status == RunState.DEAD
    assert state.error is not None
    assert "acs-sandbox-default:latest cannot be pulled (ImagePullBackOff)" in state.error
    assert "pull access denied" in state.error


def test_an_unschedulable_pod_is_a_capacity_verdict_unless_it_waits_for_its_volume() -> None:
    def scheduled(message: str) -> dict[str, Any]:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
        return pod({"phase": "Pending", "conditions": [condition]})

    short = scheduled("0/2 nodes are available: 2 Insufficient memory.")
    assert capacity_verdict(short) == "0/2 nodes are available: 2 Insufficient memory."
    assert state_of(short, None).status == RunState.CREATED
    waiting = scheduled('persistentvolumeclaim "acs-01abc-workspace" not found')
    assert capacity_verdict(waiting) is None


def shipped_environment(service_host: str | None) -> dict[str, str]:
    """What a control plane pod of deploy/kubernetes/base gets: the ConfigMap, and the
    Deployment's own values with Kubernetes' `$(VAR)` expansion of the acs-webhooks Service's
    variables (left as written when the Service is missing, as Kubernetes does)."""
    base = REPO / "deploy" / "kubernetes" / "base"
    (config_map,) = yaml.safe_load_all((base / "config.yaml").read_text())
    (deployment,) = yaml.safe_load_all((base / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    services = {} if service_host is None else {
        "ACS_WEBHOOKS_SERVICE_HOST": service_host, "ACS_WEBHOOKS_SERVICE_PORT": "3001",
    }  # fmt: skip
    environ = {**config_map["data"], "ACS_SECRET_KEY": Fernet.generate_key().decode()}
    for entry in container["env"]:
        if "value" in entry:
            environ[entry["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: services.get(m[1], m[0]), entry["value"]
            )
    return environ


def test_the_shipped_configuration_runs_sandboxes_on_kubernetes() -> None:
    config = load_config(shipped_environment("10.96.0.50"))
    assert config.driver == "kubernetes"
    kube = config.runtime
    assert isinstance(kube, KubernetesSettings)
    assert kube.kube_namespace == "acs-sandboxes"
    assert kube.kubeconfig is None  # the pod's service account
    assert kube.kube_control_plane_url == "http://10.96.0.50:3001"
    assert kube.kube_control_plane_namespace == "acs"
    assert kube.kube_control_plane_labels == {"app.kubernetes.io/name": "acs-control-plane"}
    assert config.webhook_port == 3001


def test_a_pod_made_before_the_webhook_service_stops_saying_why() -> None:
    with pytest.raises(ConfigError, match=r"ACS_KUBE_CONTROL_PLANE_URL: .*did not set"):
        load_config(shipped_environment(None))
