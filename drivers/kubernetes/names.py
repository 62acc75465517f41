"""Names, labels and annotations of the Kubernetes objects behind a sandbox.

A sandbox `<id>` of the deployment whose prefix is `<prefix>` is, in the sandbox namespace: the
pod `<prefix><id>`, the claim `<prefix><id>-workspace`, the NetworkPolicy `<prefix><id>` and,
with per-sandbox Services, the Service `<prefix><id>`. Each carries the labels below, so that one
selector (`acs/prefix=…`) finds every object of a deployment and `acs/sandbox-id` ties them
together; the exact owner, spec and prefix are annotations too, since a label value is limited
to 63 characters of `[A-Za-z0-9_.-]` (a user id may hold `@`, the pool's owner is `~pool`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

LABEL_PREFIX = "acs/prefix"
"""Scopes a deployment (and a test run): every list, watch and sweep selects on it."""
LABEL_ID = "acs/sandbox-id"
LABEL_OWNER = "acs/owner"
LABEL_SPEC = "acs/spec"
ANNOTATION_OWNER = "acs/owner"
ANNOTATION_SPEC = "acs/spec"
ANNOTATION_PREFIX = "acs/prefix"
ANNOTATION_DETACHED = "acs/detached-at"
"""On a claim whose sandbox was removed with its workspace kept (`remove(keep_workspace=True)`):
the claim is left for an operator, and the sweeps no longer list it as a sandbox."""
ANNOTATION_RUN_AS = "acs/run-as"
"""On a workspace claim: the "uid:gid" its sandbox runs as, which the snapshot helpers that read
or fill it run as too (drivers/kubernetes/files.py)."""
LABEL_FILES = "acs/files-prefix"
"""On a snapshot helper pod: the deployment's prefix. Not acs/prefix: no list or watch of
sandboxes ever sees a helper."""
COMMON_LABELS = {
    "app.kubernetes.io/name": "acs-sandbox",
    "app.kubernetes.io/managed-by": "acs-control-plane",
}

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")
PREFIX_PATTERN = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9-])?$"
"""A prefix that makes valid names of every kind: Services need a DNS-1035 label (a letter
first, at most 63 characters, no dots), and `<prefix><22-hex id>` must fit."""


def label_value(value: str) -> str:
    """`value` itself when it is a valid label value, else a readable and unique stand-in: its
    label-safe characters and 12 hex digits of its SHA-256 (`~pool` -> `pool-3f2a…`)."""
    if _LABEL_VALUE.match(value):
        return value
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", value)
    safe = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", safe)[:40]
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"{safe}-{digest}" if safe else f"h-{digest}"


def pod_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}"


def helper_name(prefix: str, token: str) -> str:
    return f"{prefix}files-{token}"


def claim_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}-workspace"


def policy_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}"


def service_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}"


def labels(prefix: str, sandbox_id: str, owner: str, spec_id: str) -> dict[str, str]:
    return {
        **COMMON_LABELS,
        LABEL_PREFIX: label_value(prefix),
        LABEL_ID: sandbox_id,
        LABEL_OWNER: label_value(owner),
        LABEL_SPEC: label_value(spec_id),
    }


def object_annotations(prefix: str, owner: str, spec_id: str) -> dict[str, str]:
    return {ANNOTATION_PREFIX: prefix, ANNOTATION_OWNER: owner, ANNOTATION_SPEC: spec_id}


def selector(prefix: str, owner: str | None = None) -> str:
    """The label selector of a deployment's objects (of one owner's, when given)."""
    parts = [f"{LABEL_PREFIX}={label_value(prefix)}"]
    if owner is not None:
        parts.append(f"{LABEL_OWNER}={label_value(owner)}")
    return ",".join(parts)


def pod_selector(prefix: str, sandbox_id: str) -> dict[str, str]:
    """What a sandbox's NetworkPolicy and Service select: its pod, whatever its incarnation."""
    return {LABEL_PREFIX: label_value(prefix), LABEL_ID: sandbox_id}


def identity(metadata: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(sandbox id, owner, spec id, prefix) of an object of ours, None for anything else."""
    found_labels = metadata.get("labels") or {}
    found_annotations = metadata.get("annotations") or {}
    sandbox_id = found_labels.get(LABEL_ID)
    if not sandbox_id:
        return None
    return (
        str(sandbox_id),
        str(found_annotations.get(ANNOTATION_OWNER, "")),
        str(found_annotations.get(ANNOTATION_SPEC, "")),
        str(found_annotations.get(ANNOTATION_PREFIX, "")),
    )


def sandbox_of(obj: Mapping[str, Any]) -> str:
    """The sandbox id an object of ours carries; "" for anything else."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ID, ""))


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def uid_of(obj: Mapping[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def owner_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OWNER, ""))


def detached(claim: Mapping[str, Any]) -> bool:
    """A claim left behind by a removal that kept the workspace (no longer a sandbox)."""
    return ANNOTATION_DETACHED in ((claim.get("metadata") or {}).get("annotations") or {})
