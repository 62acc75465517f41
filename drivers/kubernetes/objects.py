"""The Kubernetes objects of one sandbox, as manifests made from its SandboxRequest: the one
translation of a request (the bench's raw baselines make the same objects through it).

- The workspace: a PersistentVolumeClaim (ReadWriteOnce, ACS_KUBE_WORKSPACE_SIZE, the storage
  class chosen or the cluster's default). The pod mounts its `workspace/` directory at the spec's
  working_dir and `state/<path>` at each path the request keeps (the agent server's state), so a
  new pod after a pause finds both.
- The pod: one container running the image's entrypoint with the spec's command as its
  arguments, uid/gid of the spec's user, every capability dropped, no privilege escalation,
  RuntimeDefault seccomp, the spec's read-only root with memory-backed emptyDirs where it asks
  for tmpfs, no service-account token, no service links, `restartPolicy: Never` (a crash is
  reported, not hidden by restarts), the reservation as its memory request and the spec's
  memory as its limit, the spec's runtime as a RuntimeClass.
- The NetworkPolicy (drivers/kubernetes/egress.py) and, with ACS_KUBE_ENDPOINT=service, a ClusterIP
  Service selecting the pod by sandbox id.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from drivers.base import SandboxRequest
from drivers.errors import DriverError
from drivers.kubernetes.egress import Egress, Peers, policy_spec
from drivers.kubernetes.names import (
    ANNOTATION_PREFIX,
    ANNOTATION_RUN_AS,
    COMMON_LABELS,
    LABEL_FILES,
    claim_name,
    label_value,
    labels,
    object_annotations,
    pod_name,
    pod_selector,
    policy_name,
    service_name,
)
from drivers.kubernetes.settings import KubernetesSettings

Json = dict[str, Any]
CONTAINER = "sandbox"
WORKSPACE_VOLUME = "workspace"
_SIZE = re.compile(r"(?:^|,)size=([0-9]+)([kmg]?)(?:,|$)", re.IGNORECASE)


def image_reference(image: str, registry: str | None) -> str:
    """The image as pods name it: under ACS_KUBE_IMAGE_REGISTRY unless it names a registry."""
    if not registry:
        return image
    first, slash, _rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"{registry.rstrip('/')}/{image}"


def _metadata(name: str, request: SandboxRequest, prefix: str) -> Json:
    return {
        "name": name,
        "labels": labels(prefix, request.sandbox_id, request.owner, request.spec_id),
        "annotations": object_annotations(prefix, request.owner, request.spec_id),
    }


def claim_manifest(request: SandboxRequest, settings: KubernetesSettings, prefix: str) -> Json:
    spec: Json = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.kube_workspace_size}},
    }
    if settings.kube_storage_class:
        spec["storageClassName"] = settings.kube_storage_class
    metadata = _metadata(claim_name(prefix, request.sandbox_id), request, prefix)
    ids = _ids(request.user)
    if ids is not None:
        metadata["annotations"][ANNOTATION_RUN_AS] = f"{ids[0]}:{ids[1]}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": spec,
    }


HELPER_CONTAINER = "files"
HELPER_DEADLINE = 3600
"""Seconds a snapshot helper pod may live at most (the sweep removes it sooner once idle)."""


def helper_manifest(
    name: str,
    claim: str,
    settings: KubernetesSettings,
    prefix: str,
    *,
    image: str,
    run_as: tuple[int, int],
    node: str | None,
    read_only: bool,
) -> Json:
    """A snapshot helper: the trusted helper image, idle (`sleep`) until the driver runs
    drivers/files_helper.py in it through exec, with the workspace claim at /acs/claim (read-only
    for an export) and a scratch directory at /acs/work. It runs as the sandbox's own uid and gid
    (every file of the claim is theirs: the sandbox runs unprivileged), under the Restricted Pod
    Security Standard like the sandbox, with no network need, no token, and on the sandbox's
    node when it reads a running one (`node`)."""
    uid, gid = run_as
    security: Json = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
    }
    spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": HELPER_DEADLINE,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": HELPER_CONTAINER,
                "image": image_reference(image, settings.kube_image_registry),
                "imagePullPolicy": settings.kube_image_pull_policy,
                "command": ["sleep", str(HELPER_DEADLINE)],
                "resources": {
                    "requests": {"memory": "64Mi", "cpu": "50m"},
                    "limits": {"memory": "512Mi", "cpu": "1"},
                },
                "securityContext": security,
                "volumeMounts": [
                    {"name": "claim", "mountPath": "/acs/claim", "readOnly": read_only},
                    {"name": "work", "mountPath": "/acs/work"},
                ],
            }
        ],
        "volumes": [
            {
                "name": "claim",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only},
            },
            # Bounded: the export stages changed files here, on the node's disk (files.py
            # refuses a snapshot that needs more before anything is copied).
            {"name": "work", "emptyDir": {"sizeLimit": settings.kube_snapshot_scratch_size}},
        ],
    }
    if node:
        spec["nodeName"] = node
    elif settings.kube_node_selector:
        spec["nodeSelector"] = dict(settings.kube_node_selector)
    if settings.kube_image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.kube_image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                **COMMON_LABELS,
                "app.kubernetes.io/name": "acs-files-helper",
                LABEL_FILES: label_value(prefix),
            },
            "annotations": {ANNOTATION_PREFIX: prefix},
        },
        "spec": spec,
    }


def service_manifest(request: SandboxRequest, prefix: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(prefix, request.sandbox_id), request, prefix),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(prefix, request.sandbox_id),
            # The control plane probes /health itself: route to the pod as soon as it exists.
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": f"p{port}", "port": port, "targetPort": port, "protocol": "TCP"}
                for port in request.ports
            ],
        },
    }


def policy_manifest(
    request: SandboxRequest, prefix: str, peers: Peers, egress: Egress, namespace: str
) -> Json:
    selector = pod_selector(prefix, request.sandbox_id)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(policy_name(prefix, request.sandbox_id), request, prefix),
        "spec": policy_spec(selector, request.ports, peers, egress, namespace),
    }


def _ids(user: str | None) -> tuple[int, int] | None:
    """uid and gid of `uid[:gid]`; None for the image's USER. Raises DriverError for a user
    name: Kubernetes runs containers by number (and must, to check runAsNonRoot)."""
    if user is None:
        return None
    uid, _sep, gid = user.partition(":")
    if not (uid.isascii() and uid.isdigit()) or (gid and not (gid.isascii() and gid.isdigit())):
        raise DriverError(f"user {user!r}: on Kubernetes a spec's user must be uid[:gid] numbers")
    return int(uid), int(gid or uid)


def _tmpfs_size(options: str) -> str | None:
    match = _SIZE.search(options)
    if not match:
        return None
    unit = {"": "", "k": "Ki", "m": "Mi", "g": "Gi"}[match.group(2).lower()]
    return f"{match.group(1)}{unit}"


def _volumes(
    request: SandboxRequest, settings: KubernetesSettings, prefix: str
) -> tuple[list[Json], list[Json]]:
    claim = claim_name(prefix, request.sandbox_id)
    volumes: list[Json] = [
        {"name": WORKSPACE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    ]
    mounts: list[Json] = [
        {"name": WORKSPACE_VOLUME, "mountPath": request.working_dir, "subPath": "workspace"}
    ]
    kept = [posixpath.normpath(p) for p in request.kept_paths]
    for path in kept:
        sub = "state/" + path.strip("/")
        mounts.append({"name": WORKSPACE_VOLUME, "mountPath": path, "subPath": sub})
    for n, (path, mount_options) in enumerate(sorted(request.tmpfs.items())):
        if posixpath.normpath(path) in kept:
            continue  # kept on the claim instead: it must outlive the pod
        empty: Json = {"medium": "Memory"}
        if size := _tmpfs_size(mount_options):
            empty["sizeLimit"] = size
        volumes.append({"name": f"tmp-{n}", "emptyDir": empty})
        mounts.append({"name": f"tmp-{n}", "mountPath": path})
    return volumes, mounts


def pod_manifest(
    request: SandboxRequest,
    settings: KubernetesSettings,
    prefix: str,
    *,
    aliases: list[Json],
    runtime_class: str | None,
) -> Json:
    ids = _ids(request.user)
    volumes, mounts = _volumes(request, settings, prefix)
    security: Json = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": request.read_only,
        "runAsNonRoot": True,
    }
    pod_security: Json = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if ids is not None:
        uid, gid = ids
        security.update(runAsUser=uid, runAsGroup=gid)
        pod_security.update(
            runAsUser=uid, runAsGroup=gid, fsGroup=gid, fsGroupChangePolicy="OnRootMismatch"
        )
    container: Json = {
        "name": CONTAINER,
        "image": image_reference(request.image, settings.kube_image_registry),
        "imagePullPolicy": settings.kube_image_pull_policy,
        "workingDir": request.working_dir,
        "env": [{"name": k, "value": v} for k, v in request.env.items()],
        "ports": [{"containerPort": port, "protocol": "TCP"} for port in request.ports],
        "resources": {
            "requests": {
                "memory": str(request.memory_reservation),
                "cpu": f"{max(1, round(min(settings.kube_cpu_request, request.cpus) * 1000))}m",
            },
            "limits": {
                "memory": str(request.memory_bytes),
                "cpu": f"{max(1, round(request.cpus * 1000))}m",
            },
        },
        "securityContext": security,
        "volumeMounts": mounts,
    }
    if request.command:
        container["args"] = list(request.command)  # the image's entrypoint (tini) stays PID 1
    spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.kube_pause_grace,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if aliases:
        spec["hostAliases"] = aliases
    if settings.kube_image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in settings.kube_image_pull_secrets]
    if settings.kube_node_selector:
        spec["nodeSelector"] = dict(settings.kube_node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(pod_name(prefix, request.sandbox_id), request, prefix),
        "spec": spec,
    }
