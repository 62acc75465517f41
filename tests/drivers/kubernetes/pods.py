"""Small helpers for the Kubernetes tests: pod manifests that run like a sandbox (uid 1000, every
capability dropped), waiting on a pod's phase or condition, reading its log."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client

from tests.support.sandbox_helpers import DEFAULT_IMAGE

SANDBOX_UID = 1000


def restricted_container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    """A container running `script` with python3, as uid 1000 with every capability dropped."""
    return {
        "name": name,
        "image": DEFAULT_IMAGE,
        "imagePullPolicy": "IfNotPresent",  # loaded onto the nodes; there is no registry
        "command": ["python3", "-u", "-c", script],
        "securityContext": {
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        **extra,
    }


def pod_manifest(
    name: str,
    script: str,
    *,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    restart: str = "Never",
    ports: list[int] | None = None,
    readiness_port: int | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if mounts:
        extra["volumeMounts"] = mounts
    if ports:
        extra["ports"] = [{"containerPort": port} for port in ports]
    if readiness_port:
        extra["readinessProbe"] = {"tcpSocket": {"port": readiness_port}, "periodSeconds": 1}
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 0,
        "containers": [restricted_container("main", script, **extra)],
    }
    if node:
        # Through the scheduler (not spec.nodeName), so that scheduling is exercised too.
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": spec,
    }


async def wait_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    phases: tuple[str, ...] = ("Running",),
    ready: bool = False,
    within: float = 60,
) -> client.V1Pod:
    """Poll until the pod is in one of `phases` (and Ready if asked); fail with its status."""
    deadline = time.monotonic() + within
    pod = None
    while time.monotonic() < deadline:
        pod = await core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases and (not ready or condition(pod, "Ready") == "True"):
            return pod
        if pod.status.phase in ("Failed", "Succeeded") and pod.status.phase not in phases:
            break
        await asyncio.sleep(0.2)
    log = await pod_log(core, namespace, name) if pod and pod.status.phase != "Pending" else ""
    raise AssertionError(f"pod {namespace}/{name} not {phases}: {pod and pod.status}\nlog: {log}")


def condition(pod: client.V1Pod, kind: str) -> str | None:
    for item in pod.status.conditions or []:
        if item.type == kind:
            return str(item.status)
    return None


async def pod_log(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The pod's log, for a failure's message only. Raw: with its content preloaded, the client
    parses a log that looks like JSON into a dict. A test must not depend on it: with dockershim
    (v1.20) each kubelet's garbage collection removes every /var/log/pods entry of a pod it does
    not know, and the two nodes (and any other slot's cluster) share that fixed host directory,
    so a pod's log can vanish within a minute ("failed to try resolving symlinks in path
    /var/log/pods/…", seen in CI). What a test reads goes through `run_to_completion`."""
    response = await core.read_namespaced_pod_log(name, namespace, _preload_content=False)
    return f"{response.status} {(await response.read()).decode()}"


# Prepended to a run-once script: what it prints also goes to /dev/termination-log, which the
# kubelet keeps in the node's own directory and copies into the pod's status when the container
# ends (up to 4096 bytes): unlike the log, no other kubelet can remove it.
TEE_TO_TERMINATION_MESSAGE = """\
import sys as _sys
class _Tee:
    def __init__(self, *streams):
        self.streams = streams
    def write(self, text):
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)
    def flush(self):
        pass
_sys.stdout = _Tee(_sys.stdout, open("/dev/termination-log", "w"))
"""


async def wait_gone(core: client.CoreV1Api, namespace: str, name: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await core.read_namespaced_pod(name, namespace)
        except client.ApiException as error:
            if error.status == 404:
                return
            raise
        await asyncio.sleep(0.2)
    raise AssertionError(f"pod {namespace}/{name} still exists after {within}s")


async def run_to_completion(
    core: client.CoreV1Api, namespace: str, manifest: dict[str, Any], within: float = 60
) -> tuple[client.V1Pod, str]:
    """Create a run-once pod, wait until it Succeeded, return it and what it printed."""
    name = manifest["metadata"]["name"]
    container = manifest["spec"]["containers"][0]
    command = container["command"]
    container["command"] = [*command[:-1], TEE_TO_TERMINATION_MESSAGE + command[-1]]
    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, name, phases=("Succeeded",), within=within)
    terminated = pod.status.container_statuses[0].state.terminated
    return pod, terminated.message or ""
