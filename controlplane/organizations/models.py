"""Organizations, members and their limits, as stored and as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.auth.models import USER_ID_PATTERN
from controlplane.config import ORG_ID_PATTERN
from controlplane.organizations.roles import Role


class OrgLimits(BaseModel):
    """Per-member caps: set on an organization, for each of its members; set on a member, for
    them alone. A member's own override the organization's, which override the deployment's
    ACS_MAX_RUNNING_PER_USER and ACS_MAX_SANDBOXES_PER_USER; unset (null): the next one."""

    model_config = ConfigDict(extra="forbid")

    max_running_sandboxes: int | None = Field(
        default=None, ge=0, le=100_000, description="STARTING + RUNNING sandboxes; 0: no limit"
    )
    max_sandboxes: int | None = Field(
        default=None, ge=0, le=1_000_000, description="sandboxes in any state; 0: no limit"
    )
    llm_monthly_budget: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        description="USD a member may spend through the LLM gateway in the organization a "
        "calendar month (UTC); 0: nothing (a budget, not a cap: 0 is not 'no limit')",
    )


class Organization(BaseModel):
    """What Canvas reads (`id`, `name`, `is_personal`) plus what admins manage."""

    id: str
    name: str
    is_personal: bool = False
    created_at: datetime | None = None
    role: Role | None = Field(default=None, description="The caller's role in it")
    limits: OrgLimits = Field(
        default_factory=OrgLimits, description="Each member's caps here (unless their own)"
    )
    llm_monthly_budget: float | None = Field(
        default=None,
        description="USD the whole organization may spend through the LLM gateway a calendar "
        "month (UTC); null: no budget of its own",
    )
    warm_pool_share: float | None = Field(
        default=None,
        description="The part of each spec's warm pool its members may claim within "
        "ACS_POOL_SHARE_WINDOW; past it their creates start cold. null: no share (the whole pool)",
    )


class OrganizationPage(BaseModel):
    items: list[Organization]
    current_org_id: str | None = Field(
        description="The organization the caller acts in when a request names none"
    )
    next_page_id: str | None = Field(
        default=None, description="The page after this one (only when `limit` was given)"
    )


class OrganizationMember(BaseModel):
    org_id: str
    user_id: str
    email: str | None = None
    role: Role
    status: Literal["active"] = "active"
    permissions: list[str] = Field(
        description="`edit_org_settings` (Canvas's gate for profile editing: profiles are each "
        "member's own) plus what the role may do to others' things (roles.py)"
    )
    limits: OrgLimits = Field(default_factory=OrgLimits)


class MemberPage(BaseModel):
    items: list[OrganizationMember]
    next_page_id: str | None = Field(
        default=None, description="The page after this one (only when `limit` was given)"
    )


class CreateOrganization(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=ORG_ID_PATTERN)
    name: str = Field(min_length=1, max_length=120)
    owner: str | None = Field(
        default=None, pattern=USER_ID_PATTERN, description="Its first owner (default: the caller)"
    )


class UpdateOrganization(BaseModel):
    """Absent: unchanged. `limits` replaces every member cap at once; `llm_monthly_budget` and
    `warm_pool_share` set to null are removed."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=120)
    limits: OrgLimits | None = None
    llm_monthly_budget: float | None = Field(
        default=None, ge=0, le=1e9, description="USD a calendar month for the organization"
    )
    warm_pool_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="0 to 1: the part of each spec's warm pool (ACS_POOL_SIZE) its members may "
        "claim within ACS_POOL_SHARE_WINDOW, rounded down; 0: none",
    )


class MemberLlmUsage(BaseModel):
    user_id: str
    cost: float
    prompt_tokens: int
    completion_tokens: int
    requests: int
    monthly_budget: float | None = Field(
        description="Their budget here: their own, else the organization's `limits`; null: none"
    )


class OrgLlmUsage(BaseModel):
    """What the LLM gateway metered for an organization this month, in all and by member."""

    org_id: str
    month: str
    cost: float
    prompt_tokens: int
    completion_tokens: int
    requests: int
    monthly_budget: float | None = Field(description="The organization's; null: none")
    members: list[MemberLlmUsage]


class PutMember(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    limits: OrgLimits | None = None


class Switched(BaseModel):
    current_org_id: str
