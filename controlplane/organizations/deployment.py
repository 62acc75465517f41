"""The check every organization path of the layers above makes (the profile routes under
`/api/organizations/{org_id}/profiles`): the path must name the organization the request acts
in (X-Org-Id, else the caller's current one)."""

from __future__ import annotations

from controlplane.auth.models import Principal
from controlplane.errors import NotFound


def require_org(org_id: str, principal: Principal) -> None:
    """Raises NotFound for any organization but the one `principal` acts in."""
    if org_id != principal.org_id:
        raise NotFound(f"organization {org_id} not found")
