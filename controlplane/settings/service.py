"""Settings, git providers and custom secrets of one user, with documented merge semantics."""

from __future__ import annotations

from controlplane.errors import Conflict, NotFound
from controlplane.settings.mcp import MCPConfig
from controlplane.settings.models import (
    SECRET_FIELDS,
    GitProvidersUpdate,
    ProviderTokenInfo,
    SecretCreate,
    SecretInfo,
    SecretListItem,
    SecretUpdate,
    SettingsFields,
    SettingsResponse,
    SettingsUpdate,
    StoredProviderToken,
    StoredSecret,
    UserRecord,
    UserSecretsInfo,
)
from controlplane.settings.profiles import LlmProfilesView, view_of
from controlplane.settings.store import UserRecordStore
from controlplane.settings.v1 import SettingsV1Update, flatten
from controlplane.store import audit

_INDICATORS = {
    "llm_api_key_set",
    "search_api_key_set",
    "sandbox_api_key_set",
    "provider_tokens_set",
    "secrets_store",
}


def _merge_mcp(record: UserRecord, incoming: MCPConfig) -> None:
    record.settings.mcp_config = incoming.merged_with(record.settings.mcp_config)


class SettingsService:
    def __init__(self, store: UserRecordStore) -> None:
        self._store = store

    async def record(self, user_id: str) -> UserRecord:
        """The full record, secrets included: for services that hand them to a sandbox."""
        return await self._store.get(user_id)

    async def records(self, user_ids: list[str]) -> dict[str, UserRecord]:
        """The full records of several users (as `record`), read in one round trip."""
        unique = sorted(set(user_ids))
        return dict(zip(unique, await self._store.get_many(unique), strict=True))

    async def get(self, user_id: str) -> SettingsResponse:
        """The user's settings as shown to clients: secrets null, indicators set."""
        return _to_response(await self._store.get(user_id))

    async def with_profiles(self, user_id: str) -> tuple[SettingsResponse, LlmProfilesView]:
        """The user's settings as `get` shows them, and their LLM profiles (keys null), from
        one read of the record."""
        record = await self._store.get(user_id)
        return _to_response(record), view_of(record)

    async def update_v1(self, user_id: str, body: SettingsV1Update) -> SettingsResponse:
        """A V1 update (flat or nested fields: v1.flatten, against what is stored), and the
        settings after it."""
        await self.update(user_id, flatten(body, await self.get(user_id)))
        return await self.get(user_id)

    async def update(self, user_id: str, update: SettingsUpdate) -> None:
        """Change only the fields present in `update` (see SettingsUpdate for secrets)."""
        present = update.model_fields_set - _INDICATORS
        audit.note(fields=",".join(sorted(present)))  # the names: never what they hold

        def change(record: UserRecord) -> None:
            for name in present:
                if name in SECRET_FIELDS:
                    secret = getattr(update, name)
                    if secret is not None:
                        setattr(record, name, secret.get_secret_value() or None)
                elif name == "mcp_config":
                    if update.mcp_config is None:
                        record.settings.mcp_config = None
                    else:
                        _merge_mcp(record, update.mcp_config)
                else:
                    setattr(record.settings, name, getattr(update, name))
            # Re-validate the merged whole so a stored record is always a valid one.
            record.settings = SettingsFields.model_validate(record.settings.model_dump())

        await self._store.update(user_id, change)

    async def add_git_providers(self, user_id: str, update: GitProvidersUpdate) -> None:
        """Merge provider tokens (token omitted keeps, "" removes); replace mcp_config if sent."""
        audit.note(providers=",".join(sorted(p.value for p in update.provider_tokens)))

        def change(record: UserRecord) -> None:
            for provider, incoming in update.provider_tokens.items():
                stored = record.provider_tokens.get(provider)
                token = incoming.token.get_secret_value() if incoming.token is not None else None
                if token == "":
                    record.provider_tokens.pop(provider, None)
                    continue
                if token is None and stored is None:
                    # Nothing to keep: an entry without a token would be a hollow promise.
                    # 409: the same body is fine once a token is stored.
                    raise Conflict(f"no token is stored for {provider.value}; send one")
                record.provider_tokens[provider] = StoredProviderToken(
                    token=token if token is not None else stored.token,  # type: ignore[union-attr]  # set above
                    host=incoming.host,
                    user_id=incoming.user_id
                    if "user_id" in incoming.model_fields_set
                    else (stored.user_id if stored else None),
                )
            if update.mcp_config is not None:
                _merge_mcp(record, update.mcp_config)

        await self._store.update(user_id, change)

    async def unset_provider_tokens(self, user_id: str) -> None:
        """Forget every provider token; custom secrets stay."""
        await self._store.update(user_id, lambda record: record.provider_tokens.clear())

    async def list_secrets(self, user_id: str) -> list[SecretListItem]:
        record = await self._store.get(user_id)
        return [
            SecretListItem(name=name, description=secret.description)
            for name, secret in sorted(record.custom_secrets.items())
        ]

    async def create_secret(self, user_id: str, body: SecretCreate) -> None:
        """Raises Conflict when the name is taken."""

        def change(record: UserRecord) -> None:
            if body.name in record.custom_secrets:
                raise Conflict(f"Secret {body.name} already exists")
            record.custom_secrets[body.name] = StoredSecret(
                value=body.value.get_secret_value(), description=body.description
            )

        await self._store.update(user_id, change)

    async def update_secret(self, user_id: str, name: str, body: SecretUpdate) -> None:
        """Rename and/or re-describe. Raises NotFound, or Conflict when the new name is taken."""

        def change(record: UserRecord) -> None:
            secret = record.custom_secrets.get(name)
            if secret is None:
                raise NotFound(f"Secret {name} not found")
            if "description" in body.model_fields_set:
                secret.description = body.description
            new_name = body.name or name
            if new_name != name:
                if new_name in record.custom_secrets:
                    raise Conflict(f"Secret {new_name} already exists")
                del record.custom_secrets[name]
                record.custom_secrets[new_name] = secret

        await self._store.update(user_id, change)

    async def delete_secret(self, user_id: str, name: str) -> None:
        """Raises NotFound when no such secret exists."""

        def change(record: UserRecord) -> None:
            if record.custom_secrets.pop(name, None) is None:
                raise NotFound(f"Secret {name} not found")

        await self._store.update(user_id, change)


def _to_response(record: UserRecord) -> SettingsResponse:
    fields = record.settings.model_dump()
    if record.settings.mcp_config is not None:
        fields["mcp_config"] = record.settings.mcp_config.masked().model_dump()
    return SettingsResponse(
        **fields,
        llm_api_key_set=bool(record.llm_api_key and record.llm_api_key.strip()),
        search_api_key_set=bool(record.search_api_key and record.search_api_key.strip()),
        sandbox_api_key_set=bool(record.sandbox_api_key),
        provider_tokens_set={p.value: t.host for p, t in record.provider_tokens.items()},
        secrets_store=UserSecretsInfo(
            provider_tokens={
                p.value: ProviderTokenInfo(host=t.host, user_id=t.user_id)
                for p, t in record.provider_tokens.items()
            },
            custom_secrets={
                name: SecretInfo(description=s.description)
                for name, s in record.custom_secrets.items()
            },
        ),
    )
