"""The deployment's one organization: its id, and the check every organization path makes (the
organization routes, and the profile routes under `/api/organizations/{org_id}/profiles`)."""

from __future__ import annotations

from controlplane.errors import NotFound

ORG_ID = "deployment"
ORG_NAME = "Agent Conversation Service"


def require_org(org_id: str) -> None:
    """Raises NotFound for any organization but the deployment's."""
    if org_id != ORG_ID:
        raise NotFound(f"organization {org_id} not found")
