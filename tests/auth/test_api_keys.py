"""Authentication: API keys in X-Session-API-Key or Authorization: Bearer, per-user isolation."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.crypto import hash_api_key
from controlplane.store import text
from tests.conftest import BOOTSTRAP_KEY
from tests.support.redis_dump import dump_redis
from tests.support.types import Client, UserHeaders


async def _assert_401(response: Any) -> None:
    assert response.status == 401
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == {"detail"}
    assert isinstance(body["detail"], str)
    assert body["detail"]


async def test_missing_key_is_401_json(client: Client) -> None:
    response = await client.get("/api/settings")
    await _assert_401(response)
    assert "api key" in (await response.json())["detail"].lower()


async def test_empty_key_is_401(client: Client) -> None:
    await _assert_401(await client.get("/api/settings", headers={"X-Session-API-Key": ""}))


async def test_wrong_key_is_401(client: Client, user_headers: UserHeaders) -> None:
    real = (await user_headers("alice"))["X-Session-API-Key"]
    key_id = real.split("_")[1]
    forged = f"acs_{key_id}_{'A' * 43}"  # right id and shape, wrong secret
    for key in ("nope", BOOTSTRAP_KEY + "x", forged, real[:-1]):
        await _assert_401(await client.get("/api/settings", headers={"X-Session-API-Key": key}))


async def test_wrong_key_on_every_write_route_is_401(client: Client) -> None:
    headers = {"X-Session-API-Key": "not-a-key"}
    for method, path in [
        ("POST", "/api/settings"),
        ("POST", "/api/add-git-providers"),
        ("POST", "/api/unset-provider-tokens"),
        ("GET", "/api/secrets"),
        ("POST", "/api/secrets"),
        ("PUT", "/api/secrets/x"),
        ("DELETE", "/api/secrets/x"),
        ("GET", "/api/v1/sandbox-specs/search"),
    ]:
        response = await client.request(method, path, headers=headers, json={})
        await _assert_401(response)


async def test_bearer_header_works(client: Client, user_headers: UserHeaders) -> None:
    key = (await user_headers("alice"))["X-Session-API-Key"]
    for scheme in ("Bearer", "bearer"):
        response = await client.get("/api/settings", headers={"Authorization": f"{scheme} {key}"})
        assert response.status == 200
    await _assert_401(
        await client.get("/api/settings", headers={"Authorization": "Bearer wrong-key"})
    )
    # Another scheme is not an API key.
    await _assert_401(await client.get("/api/settings", headers={"Authorization": f"Basic {key}"}))


async def test_bootstrap_key_works(client: Client, admin_headers: dict[str, str]) -> None:
    response = await client.get("/api/settings", headers=admin_headers)
    assert response.status == 200
    response = await client.get(
        "/api/settings", headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    )
    assert response.status == 200


async def test_created_key_works_until_revoked(client: Client, raw_redis: aioredis.Redis) -> None:
    service = ApiKeyService(raw_redis, None)
    created = await service.create("carol")
    headers = {"X-Session-API-Key": created.key}
    assert (await client.get("/api/settings", headers=headers)).status == 200
    assert [k.key_id for k in await service.list()] == [created.key_id]

    await service.revoke(created.key_id)
    await _assert_401(await client.get("/api/settings", headers=headers))
    assert await service.list() == []


async def test_keys_are_stored_only_as_hashes(
    client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    plain = [(await user_headers(user))["X-Session-API-Key"] for user in ("alice", "bob")]
    plain.append((await user_headers("root", admin=True))["X-Session-API-Key"])
    for key in plain:  # use them, so nothing stored later could hold them either
        assert (await client.get("/api/settings", headers={"X-Session-API-Key": key})).status == 200

    dump = await dump_redis(raw_redis)
    stored_hashes = set()
    async for name in raw_redis.scan_iter(count=100):
        if text(await raw_redis.type(name)) == "hash":
            row = await raw_redis.hgetall(name)
            if b"hash" in row:
                stored_hashes.add(text(row[b"hash"]))

    assert stored_hashes == {hash_api_key(key) for key in plain}
    for key in plain:
        secret_part = key.split("_", 2)[2]  # the secret itself may contain "_"
        assert key.encode() not in dump
        assert secret_part.encode() not in dump
    assert BOOTSTRAP_KEY.encode() not in dump


async def test_users_see_only_their_own_settings_and_secrets(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    bob = await user_headers("bob")
    for headers, name in ((alice, "alice"), (bob, "bob")):
        response = await client.post(
            "/api/settings", headers=headers, json={"language": name, "llm_api_key": f"k-{name}"}
        )
        assert response.status == 200
        response = await client.post(
            "/api/secrets", headers=headers, json={"name": f"{name.upper()}_ONLY", "value": "v"}
        )
        assert response.status == 201

    for headers, name, other in ((alice, "alice", "bob"), (bob, "bob", "alice")):
        settings = await (await client.get("/api/settings", headers=headers)).json()
        assert settings["language"] == name
        assert settings["llm_api_key_set"] is True
        assert list(settings["secrets_store"]["custom_secrets"]) == [f"{name.upper()}_ONLY"]
        listed = await (await client.get("/api/secrets", headers=headers)).json()
        assert [s["name"] for s in listed["custom_secrets"]] == [f"{name.upper()}_ONLY"]
        # The other user's secret cannot be reached by name either.
        response = await client.delete(f"/api/secrets/{other.upper()}_ONLY", headers=headers)
        assert response.status == 404

    # A third user starts from the defaults.
    carol = await (await client.get("/api/settings", headers=await user_headers("carol"))).json()
    assert carol["language"] is None
    assert carol["llm_api_key_set"] is False
    assert carol["secrets_store"]["custom_secrets"] == {}


async def test_health_and_openapi_need_no_key(client: Client) -> None:
    response = await client.get("/health")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}
    response = await client.get("/api/openapi.json")
    assert response.status == 200
    assert (await response.json())["openapi"] == "3.1.0"
    # A wrong key on a public route is not an error either.
    response = await client.get("/health", headers={"X-Session-API-Key": "wrong"})
    assert response.status == 200
