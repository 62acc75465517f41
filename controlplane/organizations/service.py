"""Organizations: where a caller acts (`scope`, every request), listing, making and changing
organizations and their members, switching, and the limits that apply to a member.

Rules a security office expects, and where they are enforced here:
- only a deployment admin (an admin API key) makes organizations; their owners and admins
  manage members (roles.py: MEMBERS_CHANGE);
- nobody changes their own role (no self-escalation), only owners grant, take or change the
  owner role, and the last owner cannot leave;
- someone else's organization is a 404, as for an organization that does not exist.
"""

from __future__ import annotations

from controlplane.auth.models import Principal
from controlplane.errors import Conflict, Forbidden, NotFound
from controlplane.organizations.models import (
    CreateOrganization,
    MemberPage,
    Organization,
    OrganizationMember,
    OrganizationPage,
    OrgLimits,
    PutMember,
    UpdateOrganization,
)
from controlplane.organizations.roles import GRANTS, RANK, Action, Role, may
from controlplane.organizations.store import (
    CURRENT,
    KNOWN,
    ORG_LLM_BUDGET,
    WARM_POOL_SHARE,
    OrganizationStore,
)
from controlplane.store import audit, keyspace

DEFAULT_NAME = "Agent Conversation Service"
CANVAS_PERMISSIONS = ["edit_org_settings"]
"""Canvas's gate for profile editing: profiles are each member's own, so every member has it."""


def _roles(memberships: dict[str, str]) -> dict[str, Role]:
    return {k: Role(v) for k, v in memberships.items() if not k.startswith("~")}


class OrganizationService:
    def __init__(self, store: OrganizationStore, default_org: str) -> None:
        self.store = store
        self.default_org = default_org

    async def ensure_default(self) -> None:
        await self.store.create(self.default_org, DEFAULT_NAME, "system")

    # -- where a request acts ---------------------------------------------------------------

    async def roles_of(
        self, user_id: str, memberships: dict[str, str] | None = None
    ) -> tuple[dict[str, Role], str | None]:
        """The user's roles by organization and their current organization (from
        `memberships`, the user's hash as just read, else read now). A user whose
        memberships were never managed (from before organizations, or made by `controlplane
        keys create`) is a member of the default organization."""
        if memberships is None:
            memberships = await self.store.memberships(user_id)
        roles = _roles(memberships)
        if not roles and KNOWN not in memberships:
            roles = {self.default_org: Role.MEMBER}
        return roles, memberships.get(CURRENT)

    async def scope(
        self,
        principal: Principal,
        requested: str | None,
        memberships: dict[str, str] | None = None,
    ) -> Principal:
        """`principal` acting in `requested` (X-Org-Id) if given, else in its key's
        organization, its current one, the default one, or its first. `memberships`: the
        user's hash as read in this request's authentication (else read here). Raises
        NotFound for an organization the caller is not a member of (a deployment admin may act
        in any)."""
        roles, current = await self.roles_of(principal.user_id, memberships)
        if requested:
            if requested in roles:
                return self._in(principal, requested, roles[requested])
            if principal.is_admin and await self.store.exists(requested):
                return self._in(principal, requested, None)
            raise NotFound(f"organization {requested} not found")
        for candidate in (principal.key_org_id, current, self.default_org):
            if candidate and candidate in roles:
                return self._in(principal, candidate, roles[candidate])
        if roles:
            first = min(roles)
            return self._in(principal, first, roles[first])
        if principal.is_admin:
            return self._in(principal, self.default_org, None)
        return principal  # in no organization: only their own things

    @staticmethod
    def _in(principal: Principal, org_id: str, role: Role | None) -> Principal:
        return principal.model_copy(
            update={"org_id": org_id, "org_role": role.value if role else None}
        )

    async def _role_in(self, principal: Principal, org_id: str) -> Role | None:
        """The caller's role in `org_id`; raises NotFound when they are not in it (a deployment
        admin is, as an owner, in every organization that exists)."""
        roles, _ = await self.roles_of(principal.user_id)
        if org_id in roles and await self.store.exists(org_id):
            return roles[org_id]
        if principal.is_admin and await self.store.exists(org_id):
            return None
        raise NotFound(f"organization {org_id} not found")

    def _check(self, principal: Principal, role: Role | None, action: Action) -> None:
        if principal.is_admin or (role is not None and role in GRANTS[action]):
            return
        raise Forbidden(f"your role ({role}) may not do {action.value} in this organization")

    # -- reading ----------------------------------------------------------------------------

    async def _organization(self, org_id: str, role: Role | None) -> Organization:
        found = await self.store.get(org_id)
        if found is None:
            raise NotFound(f"organization {org_id} not found")
        return Organization(id=org_id, role=role, **found)

    async def list_for(
        self, principal: Principal, after: str | None = None, limit: int | None = None
    ) -> OrganizationPage:
        """The caller's organizations (every one for a deployment admin) and the current one,
        in id order: all of them, or `limit` after the id `after` and the cursor of the next."""
        roles, _ = await self.roles_of(principal.user_id)
        if limit is None:
            ids = await self.store.all_ids() if principal.is_admin else sorted(roles)
        elif principal.is_admin:  # every organization: read a page of the index, not all of it
            ids = await self.store.ids_after(after, limit + 1)
        else:
            ids = [i for i in sorted(roles) if after is None or i > after][: limit + 1]
        following = None
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
            following = ids[-1]
        items = []
        for org_id in ids:
            found = await self.store.get(org_id)
            if found is not None:
                items.append(Organization(id=org_id, role=roles.get(org_id), **found))
        return OrganizationPage(
            items=items, current_org_id=principal.org_id, next_page_id=following
        )

    def _member(
        self, org_id: str, user_id: str, role: Role, limits: OrgLimits
    ) -> OrganizationMember:
        granted = sorted(a.value for a, who in GRANTS.items() if role in who)
        return OrganizationMember(
            org_id=org_id,
            user_id=user_id,
            role=role,
            permissions=[*CANVAS_PERMISSIONS, *granted],
            limits=limits,
        )

    async def me(self, principal: Principal, org_id: str) -> OrganizationMember:
        role = await self._role_in(principal, org_id)
        shown = role or Role.MEMBER
        if principal.is_admin and RANK[shown] < RANK[Role.ADMIN]:
            shown = Role.ADMIN  # an admin key administers every organization
        limits = await self.store.member_limits(org_id, principal.user_id)
        return self._member(org_id, principal.user_id, shown, limits)

    async def members(
        self, principal: Principal, org_id: str, after: str | None = None, limit: int | None = None
    ) -> MemberPage:
        """The organization's members in user id order: all of them, or `limit` after the user
        id `after` and the cursor of the next page. (The roles are one hash, read whole; the
        members' limits are read for the page only, in one round trip.)"""
        self._check(principal, await self._role_in(principal, org_id), Action.MEMBERS_READ)
        members = sorted((await self.store.members(org_id)).items())
        following = None
        if limit is not None:
            members = [m for m in members if after is None or m[0] > after]
            if len(members) > limit:
                members = members[:limit]
                following = members[-1][0]
        limits = await self.store.members_limits(org_id, [user for user, _ in members])
        items = [
            self._member(org_id, user, role, own)
            for (user, role), own in zip(members, limits, strict=True)
        ]
        return MemberPage(items=items, next_page_id=following)

    async def check_member(self, principal: Principal, user_id: str, action: Action) -> None:
        """May `principal` do `action` to `user_id`'s things? Raises NotFound when `user_id` is no
        member of the organization the caller acts in (as for a user that does not exist),
        Forbidden when the caller's role may not."""
        roles, _ = await self.roles_of(user_id)
        outside = principal.org_id is None or principal.org_id not in roles
        if outside and not principal.is_admin:
            raise NotFound(f"no member {user_id} in this organization")
        if not may(principal, action):
            if not may(principal, Action.MEMBERS_READ):  # a member: others are not theirs to see
                raise NotFound(f"no member {user_id} visible to you")
            raise Forbidden(f"your role ({principal.org_role}) may not do {action.value}")

    async def check_org(self, principal: Principal, org_id: str, action: Action) -> None:
        """May `principal` do `action` in `org_id`? Raises NotFound (not theirs), Forbidden."""
        self._check(principal, await self._role_in(principal, org_id), action)

    async def limits_for(
        self, org_id: str, user_id: str
    ) -> tuple[OrgLimits, OrgLimits, float | None]:
        """The organization's limits, the member's own in it, and its warm-pool share."""
        found, member = await self.store.with_member_limits(org_id, user_id)
        org = found["limits"] if found else OrgLimits()
        share = found["warm_pool_share"] if found else None
        return org, member, share

    async def budgets_for_usage(
        self, principal: Principal, org_id: str
    ) -> tuple[list[str], float | None, float | None]:
        """For reading an organization's LLM usage (Action.USAGE_READ): its members, its
        monthly budget and each member's. Raises NotFound (not theirs), Forbidden."""
        await self.check_org(principal, org_id, Action.USAGE_READ)
        found = await self.store.get(org_id)
        if found is None:
            raise NotFound(f"organization {org_id} not found")
        members = sorted(await self.store.members(org_id))
        return members, found["llm_monthly_budget"], found["limits"].llm_monthly_budget

    # -- changing ---------------------------------------------------------------------------

    async def create(self, principal: Principal, body: CreateOrganization) -> Organization:
        """Raises Forbidden (not a deployment admin) or Conflict (the id is taken)."""
        if not principal.is_admin:
            raise Forbidden("only a deployment admin (an admin API key) makes organizations")
        if not await self.store.create(body.id, body.name, principal.user_id):
            raise Conflict(f"organization {body.id} exists already")
        await self.store.set_role(body.id, body.owner or principal.user_id, Role.OWNER)
        return await self._organization(body.id, None)

    async def update(
        self, principal: Principal, org_id: str, body: UpdateOrganization
    ) -> Organization:
        role = await self._role_in(principal, org_id)
        self._check(principal, role, Action.MEMBERS_CHANGE)
        audit.note(changed=",".join(sorted(body.model_fields_set)))
        if body.name is not None:
            await self.store.rename(org_id, body.name)
        if body.limits is not None:
            await self.store.set_limits(keyspace.organization(org_id), body.limits)
        own = {
            stored: getattr(body, name)
            for name, stored in (
                ("llm_monthly_budget", ORG_LLM_BUDGET),
                ("warm_pool_share", WARM_POOL_SHARE),
            )
            if name in body.model_fields_set
        }
        if own:
            await self.store.set_values(org_id, own)
        return await self._organization(org_id, role)

    async def put_member(
        self, principal: Principal, org_id: str, user_id: str, body: PutMember
    ) -> OrganizationMember:
        """Add a member or change their role and limits. Raises NotFound, Forbidden (a role
        that may not change members, one's own role, the owner role by a non-owner) or
        Conflict (the last owner demoted)."""
        role = await self._role_in(principal, org_id)
        self._check(principal, role, Action.MEMBERS_CHANGE)
        members = await self.store.members(org_id)
        before = members.get(user_id)
        if not principal.is_admin:
            if user_id == principal.user_id and before != body.role:
                raise Forbidden("nobody changes their own role")
            owner_change = Role.OWNER in (before, body.role)
            if owner_change and role != Role.OWNER:
                raise Forbidden("only an owner grants, takes or changes the owner role")
            if role is not None and RANK[body.role] > RANK[role]:
                raise Forbidden("nobody grants a role above their own")
        if before == Role.OWNER and body.role != Role.OWNER:
            self._keep_an_owner(members, user_id)
        audit.note(previous=before.value if before else None)
        if body.limits is not None:
            audit.note(limits="set")
        await self.store.set_role(org_id, user_id, body.role)
        if body.limits is not None:
            await self.store.set_limits(keyspace.org_member_limits(org_id, user_id), body.limits)
        return self._member(
            org_id, user_id, body.role, await self.store.member_limits(org_id, user_id)
        )

    async def remove_member(self, principal: Principal, org_id: str, user_id: str) -> None:
        role = await self._role_in(principal, org_id)
        self._check(principal, role, Action.MEMBERS_CHANGE)
        members = await self.store.members(org_id)
        if user_id not in members:
            raise NotFound(f"{user_id} is not a member of {org_id}")
        if members[user_id] == Role.OWNER:
            if not principal.is_admin and role != Role.OWNER:
                raise Forbidden("only an owner removes an owner")
            self._keep_an_owner(members, user_id)
        await self.store.remove(org_id, user_id)

    @staticmethod
    def _keep_an_owner(members: dict[str, Role], leaving: str) -> None:
        if not any(r == Role.OWNER for u, r in members.items() if u != leaving):
            raise Conflict("an organization keeps at least one owner: make another first")

    async def switch(self, principal: Principal, org_id: str) -> str:
        """Make `org_id` the caller's current organization. Raises NotFound."""
        await self._role_in(principal, org_id)
        await self.store.set_current(principal.user_id, org_id)
        return org_id

    def may(self, principal: Principal, action: Action, org_id: str | None = None) -> bool:
        return may(principal, action, org_id)
