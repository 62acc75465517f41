"""Users' API keys for scripts, as their owners and admins see them: made by their owner (in the
organization they act in), listed and revoked by their owner, by a deployment admin, and by an
owner or admin of the organization a key was made in (roles.py: KEYS_MANAGE)."""

from __future__ import annotations

from controlplane.auth.models import ApiKeyInfo, CreatedApiKey, Principal
from controlplane.auth.service import ApiKeyService, KeyPage
from controlplane.errors import NotFound
from controlplane.organizations.roles import Action, may


class MemberKeys:
    def __init__(self, api_keys: ApiKeyService, default_org: str) -> None:
        self._keys = api_keys
        self._default = default_org

    def _manages(self, principal: Principal, info: ApiKeyInfo) -> bool:
        if info.user_id == principal.user_id or principal.is_admin:
            return True
        return may(principal, Action.KEYS_MANAGE, info.org_id or self._default)

    async def create(self, principal: Principal, name: str | None) -> CreatedApiKey:
        """A new key of the caller's, never an admin key, made in the organization they act
        in. Returned once with its secret."""
        return await self._keys.create(principal.user_id, name=name, org_id=principal.org_id)

    async def list(
        self, principal: Principal, user_id: str | None, offset: int = 0, count: int | None = None
    ) -> KeyPage:
        """The caller's keys, or `user_id`'s that the caller manages (none: an empty list),
        oldest first: every one, or those of the `count` from `offset` (a page may so hold fewer
        than `count`), with the offset of the next page (None: the last)."""
        found, following = await self._keys.page(user_id or principal.user_id, offset, count)
        return [k for k in found if self._manages(principal, k)], following

    async def revoke(self, principal: Principal, key_id: str) -> None:
        """Raises NotFound for a key that does not exist or that the caller does not manage."""
        info = await self._keys.get(key_id)
        if info is None or not self._manages(principal, info):
            raise NotFound(f"no API key with id {key_id}")
        await self._keys.revoke(key_id)
