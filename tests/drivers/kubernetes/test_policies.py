"""What the Kubernetes driver makes of a spec's isolation, read back from the API server: the
pod's security (uid 1000, every capability dropped, no privilege escalation, RuntimeDefault
seccomp, read-only root with writable emptyDirs, no service-account token, the spec's
RuntimeClass) and the NetworkPolicy (ingress from the control plane only, to the agent port;
egress to the control plane's ports and the spec's allow-list, or nothing more for `none`).

The test cluster's network enforces no NetworkPolicy (pods share each node's docker bridge, no
policy plugin): these are the objects a policy-aware CNI (Calico, Cilium…) enforces, checked as
written; the sandbox still runs with them (docs/deployment.md says how to check enforcement)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from controlplane import keys
from tests.drivers.kubernetes.sandbox_objects import objects
from tests.drivers.kubernetes.test_sandboxes import Headers, run
from tests.support.sandbox_helpers import agent_spec, spec_dir, start, wait_status
from tests.support.types import ClientFactory

pytestmark = [pytest.mark.kube, pytest.mark.slow]

LOCKED = agent_spec(
    "locked",
    "no egress, a read-only root, gVisor",
    """resources:
  memory: 512m
  memory_reservation: 256m
read_only_root: true
runtime: gvisor
egress: none
warm_pool: 0
""",
)
LISTED = agent_spec(
    "listed",
    "an allow-list",
    """egress: ["192.0.2.7:443", "198.51.100.0/24:80", "host.docker.internal:5005"]
warm_pool: 0
""",
)


@pytest.fixture
async def runtime_class(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """A RuntimeClass standing for gVisor (the test nodes' dockershim has only `docker`)."""
    name = f"acs-gvisor-{secrets.token_hex(3)}"
    node = client.NodeV1Api(kube_api)
    await node.create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
         "handler": "docker"}
    )  # fmt: skip
    yield name
    await node.delete_runtime_class(name)


async def test_pods_and_policies_carry_the_specs_isolation(
    *,
    make_client: ClientFactory,
    kube_overrides: dict[str, Any],
    runtime_class: str,
    user_headers: Headers,
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    webhook = kube_overrides["kube_webhook_address"]
    api = await make_client(
        with_sandboxes=True,
        spec_dir=spec_dir(tmp_path, {"locked": LOCKED, "listed": LISTED}),
        kube_runtime_classes={"gvisor": runtime_class},
        **kube_overrides,
    )
    alice = await user_headers("alice")
    locked = (await start(api, alice, "locked"))["id"]
    listed = (await start(api, alice, "listed"))["id"]
    body = await wait_status(api, alice, locked, "RUNNING", within=60)
    await wait_status(api, alice, listed, "RUNNING", within=60)
    found = await objects(kube_api, ns, prefix)

    pod = found.pod(locked)
    spec = pod["spec"]
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["runAsUser"] == 1000
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["runtimeClassName"] == runtime_class
    assert container["resources"]["limits"]["memory"] in ("512Mi", str(512 * 2**20))
    assert container["resources"]["requests"]["memory"] in ("256Mi", str(256 * 2**20))
    # In the pod: the agent's uid, no capabilities, a read-only root, a writable /tmp, no token.
    probe = (
        "id -u; grep CapEff /proc/self/status; touch /probe 2>/dev/null && echo rw || echo ro; "
        "touch /tmp/probe && echo tmp-rw; ls /var/run/secrets/kubernetes.io 2>&1 | head -1"
    )
    out = (await run(body, probe))["stdout"].split("\n")
    assert out[0] == "1000", out
    assert out[1].split() == ["CapEff:", "0000000000000000"], out
    assert out[2:4] == ["ro", "tmp-rw"], out
    assert "No such file" in out[4], out

    policy = found.of("policies")[locked]["spec"]
    control_plane = [{"ipBlock": {"cidr": f"{webhook}/32"}}]
    assert policy["podSelector"]["matchLabels"]["acs/sandbox-id"] == locked
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {"from": control_plane, "ports": [{"protocol": "TCP", "port": 8000}]}
    ]
    listener = api.app[keys.WEBHOOK_LISTENER].port
    # `none`: the control plane's webhook listener, nothing else.
    assert policy["egress"] == [
        {"to": control_plane, "ports": [{"protocol": "TCP", "port": listener}]}
    ]

    policy = found.of("policies")[listed]["spec"]
    rules = {
        (tuple(b["ipBlock"]["cidr"] for b in rule["to"]), tuple(p["port"] for p in rule["ports"]))
        for rule in policy["egress"]
    }
    assert ((f"{webhook}/32",), (listener,)) in rules
    assert ((f"{webhook}/32",), (5005,)) in rules  # host.docker.internal: the control plane
    assert (("192.0.2.7/32",), (443,)) in rules
    assert (("198.51.100.0/24",), (80,)) in rules
    assert not any("0.0.0.0/0" in cidrs for cidrs, _ in rules)
    aliases = found.pod(listed)["spec"]["hostAliases"]
    assert {"ip": webhook, "hostnames": ["host.docker.internal"]} in aliases
