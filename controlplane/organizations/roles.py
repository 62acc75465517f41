"""What each role may do in its organization: one table, read by every domain that checks it.

A member's own sandboxes, conversations and settings are theirs whatever their role (an auditor
makes none: SANDBOX_CREATE); the rest of this table is about acting on *other* members' things,
and on the organization itself. Nobody but its
author reads a conversation's content (events, messages, files): no row grants it.
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.auth.models import Principal, RoleName


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    AUDITOR = "auditor"


RANK = {Role.AUDITOR: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}
"""Which of two roles a group mapping keeps (the higher), and who may change whose role."""


class Action(StrEnum):
    SANDBOX_CREATE = "sandbox.create"
    """Start sandboxes (and so conversations) of one's own: an auditor only reads."""
    SANDBOX_READ = "sandbox.read"
    """Another member's sandboxes: list them, read their state (never their session keys)."""
    SANDBOX_OPERATE = "sandbox.operate"
    """Pause, resume or delete another member's sandbox (what the ops scripts do)."""
    USAGE_READ = "usage.read"
    """The organization's and its members' LLM usage."""
    AUDIT_READ = "audit.read"
    """The organization's audit log (issue 29, phase 2)."""
    MEMBERS_READ = "members.read"
    MEMBERS_CHANGE = "members.change"
    """Add, remove members, change roles (an owner's role: owners only), set limits."""
    KEYS_MANAGE = "keys.manage"
    """List and revoke the API keys members made in this organization."""
    ORG_DELETE = "org.delete"


GRANTS: dict[Action, frozenset[Role]] = {
    Action.SANDBOX_CREATE: frozenset({Role.OWNER, Role.ADMIN, Role.MEMBER}),
    Action.SANDBOX_READ: frozenset({Role.OWNER, Role.ADMIN, Role.AUDITOR}),
    Action.SANDBOX_OPERATE: frozenset({Role.OWNER, Role.ADMIN}),
    Action.USAGE_READ: frozenset({Role.OWNER, Role.ADMIN, Role.AUDITOR}),
    Action.AUDIT_READ: frozenset({Role.OWNER, Role.ADMIN, Role.AUDITOR}),
    Action.MEMBERS_READ: frozenset({Role.OWNER, Role.ADMIN, Role.AUDITOR}),
    Action.MEMBERS_CHANGE: frozenset({Role.OWNER, Role.ADMIN}),
    Action.KEYS_MANAGE: frozenset({Role.OWNER, Role.ADMIN}),
    Action.ORG_DELETE: frozenset({Role.OWNER}),
}
"""Who may do what to others' things in their organization. A deployment admin (an admin API
key: the operator's scripts) may do all of it in every organization."""


def role_of(principal: Principal) -> Role | None:
    return Role(principal.org_role) if principal.org_role else None


def may(principal: Principal, action: Action, org_id: str | None = None) -> bool:
    """True when `principal` may do `action` in `org_id` (default: the organization they act
    in). A principal acts in one organization at a time: another one's things are out of reach
    (404 for them), whatever their role there."""
    if principal.is_admin:
        return True
    if principal.org_id is None or (org_id is not None and org_id != principal.org_id):
        return False
    role = role_of(principal)
    return role is not None and role in GRANTS[action]


def as_role(name: RoleName | str) -> Role:
    return Role(name)
