"""Sign-in through a real OpenID provider (npm oidc-provider, tests/support/oidc_provider.py):
its login page, our callback, the session; the groups claim mapped to organizations and roles;
its signing keys rotated mid-session; a user disabled there losing access within the stated
time (ACS_OIDC_RECHECK_INTERVAL, 2 s here)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from controlplane import keys
from tests.support.oidc_sign_in import OidcLive, browser_session, sign_in

# Seconds between a session's checks here: below the setting's 5 s minimum (oidc_live's
# recheck_interval), as the tests only wait for a check.
RECHECK = 2


async def get_json(browser: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with browser.get(url, **kw) as response:
        return response.status, await response.json()


async def test_the_sign_in_page_offers_the_provider_and_signs_in(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live()
    async with browser_session() as browser:
        async with browser.get(live.url + "/auth/sign-in?next=/api/v1/users/me") as page:
            html = await page.text()
        assert "Sign in with" in html
        assert 'id="sign-in-oidc"' in html
        assert 'name="api_key"' in html  # API-key sign-in stays (single-user installs)

        status, page_html = await sign_in(browser, live.url, "alice", "/api/v1/users/me")
        assert status == 200, page_html
        assert 'id="continue"' in page_html
        assert "/api/v1/users/me" in page_html
        status, me = await get_json(browser, live.url + "/api/v1/users/me")
        assert status == 200, me
        assert (me["id"], me["is_admin"], me["auth_method"]) == ("alice", False, "oidc")

        # alice's groups (eng, eng-admins) made her an admin of eng, and nothing else.
        status, orgs = await get_json(browser, live.url + "/api/organizations")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("eng", "admin")]
        assert orgs["current_org_id"] == "eng"
        status, member = await get_json(browser, live.url + "/api/organizations/eng/me")
        assert member["role"] == "admin"
        assert "sandbox.operate" in member["permissions"]

        # No secret of the sign-in is stored in the clear: the refresh token is encrypted.
        redis = live.app[keys.REDIS]
        async for name in redis.scan_iter(match="acs:session:*"):
            row = await redis.hgetall(name)
            assert b"refresh_enc" in row
            assert b"refresh_token" not in row

    async with browser_session() as browser:  # dave's groups map nowhere: the default org
        assert (await sign_in(browser, live.url, "dave"))[0] == 200
        status, orgs = await get_json(browser, live.url + "/api/organizations")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("deployment", "member")]


async def test_users_without_an_organization_are_refused_when_so_configured(
    oidc_live: Any,
) -> None:
    live: OidcLive = await oidc_live(oidc_default_role="none")
    async with browser_session() as browser:
        status, html = await sign_in(browser, live.url, "dave")
        assert status == 401
        assert "belongs to no organization" in html
        status, _ = await get_json(browser, live.url + "/api/v1/users/me")
        assert status == 401


async def test_key_rotation_mid_session_is_followed(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live(recheck_interval=RECHECK)
    async with browser_session() as browser:
        assert (await sign_in(browser, live.url, "bob"))[0] == 200
        old_kid = live.provider.keys[0]["kid"]
        live.provider.rotate_keys()  # the old key is gone from its JWKS
        assert live.provider.keys[0]["kid"] != old_kid
        await asyncio.sleep(RECHECK + 0.5)
        # The session's check refreshes with the provider: its new ID token is signed by the
        # new key, which we fetch (an unknown kid refetches the JWKS), so access goes on.
        status, me = await get_json(browser, live.url + "/api/v1/users/me")
        assert status == 200, me
    async with browser_session() as browser:  # and a new sign-in validates too
        assert (await sign_in(browser, live.url, "carol"))[0] == 200
        status, orgs = await get_json(browser, live.url + "/api/organizations")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("eng", "auditor")]


async def test_a_user_disabled_at_the_provider_loses_access_within_the_interval(
    oidc_live: Any,
) -> None:
    live: OidcLive = await oidc_live(recheck_interval=RECHECK)
    async with browser_session() as browser:
        assert (await sign_in(browser, live.url, "bob"))[0] == 200
        own = {"Origin": live.url}
        async with browser.post(live.url + "/api/v1/keys", json={"name": "ci"}, headers=own) as r:
            assert r.status == 201, await r.text()
            script_key = (await r.json())["key"]
        bearer = {"Authorization": f"Bearer {script_key}"}
        async with aiohttp.ClientSession() as script:
            assert (await get_json(script, live.url + "/api/v1/users/me", headers=bearer))[0] == 200

            live.provider.disable("bob")
            disabled_at = time.monotonic()
            deadline = disabled_at + RECHECK + 5
            while True:
                status, _ = await get_json(browser, live.url + "/api/v1/users/me")
                if status == 401:
                    break
                assert time.monotonic() < deadline, "still signed in past the stated time"
                await asyncio.sleep(0.5)
            assert time.monotonic() - disabled_at <= RECHECK + 3  # a loaded host's scheduling
            # The provider refused bob: his keys are refused too, until he signs in again.
            status, body = await get_json(script, live.url + "/api/v1/users/me", headers=bearer)
            assert status == 401
            assert "OpenID provider" in body["detail"]

            live.provider.users["bob"].disabled = False
            live.provider.write_users()
            assert (await sign_in(browser, live.url, "bob"))[0] == 200
            assert (await get_json(script, live.url + "/api/v1/users/me", headers=bearer))[0] == 200


async def test_groups_are_applied_again_at_each_check(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live(recheck_interval=RECHECK)
    async with browser_session() as browser:
        assert (await sign_in(browser, live.url, "bob"))[0] == 200
        _, orgs = await get_json(browser, live.url + "/api/organizations")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("eng", "member")]
        live.provider.users["bob"].groups = ["audit"]
        live.provider.write_users()
        await asyncio.sleep(RECHECK + 0.5)
        _, orgs = await get_json(browser, live.url + "/api/organizations")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("eng", "auditor")]
