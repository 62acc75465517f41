"""POST /api/add-git-providers, /api/unset-provider-tokens and MCP config validation/masking."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.settings.mcp import MASK
from controlplane.settings.models import ProviderType
from tests.support.records import stored_user_record
from tests.support.types import Client, UserHeaders


async def _providers(client: Client, headers: dict[str, str], body: Any) -> tuple[int, Any]:
    response = await client.post("/api/add-git-providers", headers=headers, json=body)
    return response.status, await response.json()


async def _settings(client: Client, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.get("/api/settings", headers=headers)
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def test_round_trip_and_provider_tokens_set(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    status, body = await _providers(
        client,
        headers,
        {
            "provider_tokens": {
                "github": {"token": "ghp_one", "host": None},
                "gitlab": {"token": "glpat_two", "host": "https://gitlab.example.com/"},
            }
        },
    )
    assert (status, body) == (200, {"message": "Git providers stored"})
    settings = await _settings(client, headers)
    assert settings["provider_tokens_set"] == {"github": None, "gitlab": "gitlab.example.com"}
    assert settings["secrets_store"]["provider_tokens"] == {
        "github": {"token": None, "host": None, "user_id": None},
        "gitlab": {"token": None, "host": "gitlab.example.com", "user_id": None},
    }
    record = await stored_user_record(client, "alice")
    assert record.provider_tokens[ProviderType.GITHUB].token == "ghp_one"
    assert record.provider_tokens[ProviderType.GITLAB].token == "glpat_two"


async def test_unknown_provider_is_422(client: Client, user_headers: UserHeaders) -> None:
    status, body = await _providers(
        client, await user_headers("alice"), {"provider_tokens": {"gitea": {"token": "x"}}}
    )
    assert status == 422
    assert len(body["detail"]) == 1
    item = body["detail"][0]
    assert item["loc"][:2] == ["body", "provider_tokens"]
    assert "gitea" in item["loc"]
    assert item["type"] == "enum"


async def test_omitted_token_keeps_the_token_and_changes_the_host(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    body = {"provider_tokens": {"gitlab": {"token": "glpat_keep", "user_id": "u1"}}}
    assert (await _providers(client, headers, body))[0] == 200

    for sent in ({"host": "git.corp.example:8443"}, {"token": None, "host": "git.corp.example"}):
        status, _ = await _providers(client, headers, {"provider_tokens": {"gitlab": sent}})
        assert status == 200
        settings = await _settings(client, headers)
        assert settings["provider_tokens_set"] == {"gitlab": sent["host"]}
        stored = (await stored_user_record(client, "alice")).provider_tokens[ProviderType.GITLAB]
        assert stored.token == "glpat_keep"
        assert stored.host == sent["host"]
        assert stored.user_id == "u1"


async def test_empty_token_removes_that_provider_and_omitted_providers_are_kept(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    body = {
        "provider_tokens": {
            "github": {"token": "ghp_a"},
            "bitbucket": {"token": "bb_b"},
            "azure_devops": {"token": "az_c"},
        }
    }
    assert (await _providers(client, headers, body))[0] == 200

    assert (await _providers(client, headers, {"provider_tokens": {"bitbucket": {"token": ""}}}))[
        0
    ] == 200
    settings = await _settings(client, headers)
    assert settings["provider_tokens_set"] == {"github": None, "azure_devops": None}
    record = await stored_user_record(client, "alice")
    assert {p.value: t.token for p, t in record.provider_tokens.items()} == {
        "github": "ghp_a",
        "azure_devops": "az_c",
    }
    # An empty body changes nothing.
    assert (await _providers(client, headers, {}))[0] == 200
    assert (await _settings(client, headers))["provider_tokens_set"] == {
        "github": None,
        "azure_devops": None,
    }


async def test_first_time_provider_without_token_is_409(
    client: Client, user_headers: UserHeaders
) -> None:
    # A conflict with what is stored (nothing), not a bad value: once a token is stored, the
    # same body keeps it and changes the host.
    headers = await user_headers("alice")
    for sent in ({"host": "gitlab.example.com"}, {"token": None}):
        status, body = await _providers(client, headers, {"provider_tokens": {"gitlab": sent}})
        assert status == 409
        assert body["detail"] == "no token is stored for gitlab; send one"
    assert (await _settings(client, headers))["provider_tokens_set"] == {}


async def test_bad_host_is_422(client: Client, user_headers: UserHeaders) -> None:
    status, body = await _providers(
        client,
        await user_headers("alice"),
        {"provider_tokens": {"gitlab": {"token": "t", "host": "not a host/x"}}},
    )
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "provider_tokens", "gitlab", "host"]


async def test_unset_provider_tokens_keeps_custom_secrets(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    assert (await _providers(client, headers, {"provider_tokens": {"github": {"token": "g"}}}))[
        0
    ] == 200
    response = await client.post(
        "/api/secrets", headers=headers, json={"name": "KEEP_ME", "value": "kept"}
    )
    assert response.status == 201

    response = await client.post("/api/unset-provider-tokens", headers=headers)
    assert response.status == 200
    assert await response.json() == {"message": "Unset Git provider tokens"}
    settings = await _settings(client, headers)
    assert settings["provider_tokens_set"] == {}
    assert settings["secrets_store"]["custom_secrets"] == {
        "KEEP_ME": {"secret": None, "description": None}
    }
    record = await stored_user_record(client, "alice")
    assert record.provider_tokens == {}
    assert record.custom_secrets["KEEP_ME"].value == "kept"


STDIO_OK = {"name": "fs", "command": "npx"}


# (mcp_config sent, loc under ["body", "mcp_config"], start of the message after "Value error, ")
MCP_INVALID: list[tuple[dict[str, Any], list[str], str]] = [
    (
        {"stdio_servers": [{"name": "has space", "command": "npx"}]},
        ["stdio_servers", "0", "name"],
        "Server name can only contain letters, numbers, hyphens, and underscores",
    ),
    (
        {"stdio_servers": [STDIO_OK, {"name": "b", "command": "npx -y thing"}]},
        ["stdio_servers", "1", "command"],
        "Command should be a single executable without spaces",
    ),
    (
        {"stdio_servers": [{**STDIO_OK, "env": {"1BAD": "v"}}]},
        ["stdio_servers", "0", "env"],
        "Invalid environment variable name '1BAD'",
    ),
    (
        {"stdio_servers": [{**STDIO_OK, "env": "NO_EQUALS_SIGN"}]},
        ["stdio_servers", "0", "env"],
        "Environment variable 'NO_EQUALS_SIGN' must be in KEY=VALUE format",
    ),
    (
        {"sse_servers": [{"url": "example.com/sse"}]},
        ["sse_servers", "0", "url"],
        "URL must include a scheme (http:// or https://)",
    ),
    (
        {"sse_servers": ["ftp://example.com/sse"]},
        ["sse_servers", "0", "url"],
        "URL scheme must be http, https, ws, or wss",
    ),
    (
        {"shttp_servers": [{"url": "https://example.com/mcp", "timeout": 0}]},
        ["shttp_servers", "0", "timeout"],
        "Timeout must be positive",
    ),
    (
        {"shttp_servers": [{"url": "https://example.com/mcp", "timeout": 4000}]},
        ["shttp_servers", "0", "timeout"],
        "Timeout cannot exceed 3600 seconds",
    ),
]


@pytest.mark.parametrize("case", MCP_INVALID, ids=lambda c: "/".join(c[1]))
@pytest.mark.parametrize("route", ["/api/add-git-providers", "/api/settings"])
async def test_mcp_config_validation(
    client: Client,
    user_headers: UserHeaders,
    route: str,
    case: tuple[dict[str, Any], list[str], str],
) -> None:
    config, loc, message = case
    headers = await user_headers("alice")
    response = await client.post(route, headers=headers, json={"mcp_config": config})
    assert response.status == 422
    detail = (await response.json())["detail"]
    assert len(detail) == 1
    assert detail[0]["loc"] == ["body", "mcp_config", *loc]
    assert detail[0]["type"] == "value_error"
    assert detail[0]["msg"].startswith("Value error, " + message)
    assert (await _settings(client, headers))["mcp_config"] is None


async def test_unknown_key_in_mcp_config_is_extra_forbidden(
    client: Client, user_headers: UserHeaders
) -> None:
    status, body = await _providers(
        client, await user_headers("alice"), {"mcp_config": {"ws_servers": []}}
    )
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "mcp_config", "ws_servers"]
    assert body["detail"][0]["type"] == "extra_forbidden"


MCP = {
    "sse_servers": [
        "https://sse.example.com/mcp",
        {"url": "https://sse2.example.com", "api_key": "sse-secret"},
    ],
    "stdio_servers": [
        {
            "name": "github",
            "command": "github-mcp",
            "args": "--read-only --toolsets 'repos issues'",
            "env": {"GITHUB_TOKEN": "env-secret", "LOG_LEVEL": "debug"},
        }
    ],
    "shttp_servers": [{"url": "https://shttp.example.com/mcp", "api_key": "shttp-secret"}],
}


async def test_mcp_config_is_stored_and_returned_masked(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    assert (await _providers(client, headers, {"mcp_config": MCP}))[0] == 200
    response = await client.get("/api/settings", headers=headers)
    text = await response.text()
    config = (await response.json())["mcp_config"]
    assert config == {
        "sse_servers": [
            {"url": "https://sse.example.com/mcp", "api_key": None},
            {"url": "https://sse2.example.com", "api_key": MASK},
        ],
        "stdio_servers": [
            {
                "name": "github",
                "command": "github-mcp",
                "args": ["--read-only", "--toolsets", "repos issues"],
                "env": {"GITHUB_TOKEN": MASK, "LOG_LEVEL": MASK},
            }
        ],
        "shttp_servers": [{"url": "https://shttp.example.com/mcp", "api_key": MASK, "timeout": 60}],
    }
    assert MASK == "**********"
    for secret in ("sse-secret", "shttp-secret", "env-secret"):
        assert secret not in text

    # Posting the masked config back (as a client that read it does) keeps the real values.
    assert (await _providers(client, headers, {"mcp_config": config}))[0] == 200
    response = await client.post("/api/settings", headers=headers, json={"mcp_config": config})
    assert response.status == 200
    stored = (await stored_user_record(client, "alice")).settings.mcp_config
    assert stored is not None
    assert stored.sse_servers[0].api_key is None
    assert stored.sse_servers[1].api_key == "sse-secret"
    assert stored.shttp_servers[0].api_key == "shttp-secret"
    assert stored.stdio_servers[0].env == {"GITHUB_TOKEN": "env-secret", "LOG_LEVEL": "debug"}

    # A new value replaces the stored one; the rest stays.
    config["shttp_servers"][0]["api_key"] = "shttp-rotated"
    assert (await _providers(client, headers, {"mcp_config": config}))[0] == 200
    stored = (await stored_user_record(client, "alice")).settings.mcp_config
    assert stored is not None
    assert stored.shttp_servers[0].api_key == "shttp-rotated"
    assert stored.sse_servers[1].api_key == "sse-secret"


async def test_mcp_config_omitted_keeps_it_and_null_in_settings_clears_it(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    assert (await _providers(client, headers, {"mcp_config": MCP}))[0] == 200
    body = {"provider_tokens": {"github": {"token": "g"}}}
    assert (await _providers(client, headers, body))[0] == 200
    assert (await _settings(client, headers))["mcp_config"] is not None
    response = await client.post("/api/settings", headers=headers, json={"mcp_config": None})
    assert response.status == 200
    assert (await _settings(client, headers))["mcp_config"] is None
    assert (await stored_user_record(client, "alice")).settings.mcp_config is None
