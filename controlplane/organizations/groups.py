"""The provider's groups, applied to a user's organizations at each sign-in and session check
(ACS_OIDC_GROUP_ROLES: `group=organization:role`). Implements auth/oidc_flow.py's Memberships.

Only the organizations the mapping names are managed by it: there a user's role is the highest
their groups give, and a user none of whose groups maps there is removed. Organizations it does
not name are managed through the API alone. A user whose groups give no organization at all is
a member (or auditor) of the default one, or refused (ACS_OIDC_DEFAULT_ROLE).
"""

from __future__ import annotations

from controlplane.organizations.roles import RANK, Role
from controlplane.organizations.service import OrganizationService
from controlplane.store import audit

GROUPS_ACTOR = audit.Actor(via="oidc_groups")
"""Who changes roles from the provider's groups: the control plane, on the provider's word."""


class GroupRoles:
    def __init__(
        self, organizations: OrganizationService, mapping: list[str], default_role: str
    ) -> None:
        self._orgs = organizations
        self._mapping: list[tuple[str, str, Role]] = []
        for item in mapping:
            group, _, target = item.partition("=")
            org_id, _, role = target.rpartition(":")
            self._mapping.append((group, org_id, Role(role)))
        self._managed = {org for _, org, _ in self._mapping}
        self._default_role = None if default_role == "none" else Role(default_role)

    def roles_for(self, groups: tuple[str, ...]) -> dict[str, Role]:
        """Organization -> the highest role `groups` give there."""
        roles: dict[str, Role] = {}
        member_of = set(groups)
        for group, org_id, role in self._mapping:
            if group in member_of and (org_id not in roles or RANK[role] > RANK[roles[org_id]]):
                roles[org_id] = role
        return roles

    async def signed_in(self, user_id: str, groups: tuple[str, ...]) -> bool:
        with audit.as_actor(GROUPS_ACTOR):
            return await self._apply(user_id, groups)

    async def _apply(self, user_id: str, groups: tuple[str, ...]) -> bool:
        roles = self.roles_for(groups)
        for org_id in roles:
            await self._orgs.store.create(org_id, org_id, "oidc-groups")
        store = self._orgs.store
        await store.apply_roles(user_id, self._managed, roles)
        have, _ = await self._orgs.roles_of(user_id)
        if have:
            return True
        if self._default_role is None:
            return False
        await store.set_role(self._orgs.default_org, user_id, self._default_role)
        return True
