"""Names and labels of the Docker objects behind a sandbox: a container and a workspace volume
named with the deployment's prefix and the sandbox id, labelled with the sandbox's id, owner and
spec and with the prefix, so that a sweep finds every managed container by label."""

from __future__ import annotations

LABEL_ID = "acs.sandbox_id"
LABEL_OWNER = "acs.owner"
LABEL_SPEC = "acs.spec_id"
LABEL_PREFIX = "acs.prefix"
"""Scopes a deployment (and a test run): every list and event filter includes it."""
LABEL_NETWORK = "acs.network"
"""On our networks: the spec id of a restricted-egress network, or "shared"."""


def container_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}"


def volume_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}-workspace"


def labels(prefix: str, sandbox_id: str, owner: str, spec_id: str) -> dict[str, str]:
    return {LABEL_ID: sandbox_id, LABEL_OWNER: owner, LABEL_SPEC: spec_id, LABEL_PREFIX: prefix}
