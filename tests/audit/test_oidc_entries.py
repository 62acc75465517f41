"""What signing in through a real OpenID provider leaves in the audit log (npm oidc-provider,
tests/support/oidc_sign_in.py): the sign-in and the roles the groups gave; a refused sign-in
with its reason; a user disabled at the provider: the session the control plane ended and the
keys it suspended, then restored at the next sign-in. Nothing of the sign-in's secrets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from controlplane import keys
from tests.conftest import BOOTSTRAP_KEY
from tests.support.oidc_sign_in import OidcLive, browser_session, sign_in

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
RECHECK = 2  # seconds between a session's checks (oidc_live's recheck_interval)


async def entries(live: OidcLive, **params: str) -> list[dict[str, Any]]:
    """Oldest first."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(live.url + "/api/v1/audit-events/search", headers=ADMIN, params=params) as resp,
    ):
        body = await resp.json()
        assert resp.status == 200, body
    return list(reversed(body["items"]))


def summary(found: list[dict[str, Any]]) -> list[tuple[str, str | None, str, str]]:
    return [
        (e["event"]["action"], e["user"]["id"], e["event"]["outcome"], e["acs"]["auth"])
        for e in found
    ]


async def test_a_sign_in_and_the_roles_its_groups_gave(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live()
    async with browser_session() as browser:
        status, page = await sign_in(browser, live.url, "alice")
        assert status == 200, page
        cookies = [c.value for c in browser.cookie_jar if len(c.value) >= 16]
    assert cookies  # the session cookie at least
    found = await entries(live)
    assert summary(found) == [
        ("org.create", None, "success", "oidc_groups"),
        ("member.set", None, "success", "oidc_groups"),
        ("auth.sign_in", "alice", "success", "oidc"),
    ]
    member = found[1]
    assert member["acs"]["targets"] == {"org_id": "eng", "user_id": "alice"}
    assert member["acs"]["details"]["role"] == "admin"
    assert found[2]["source"]["ip"] == "127.0.0.1"
    stored = str(await live.app[keys.REDIS].xrange("acs:audit"))
    for cookie in cookies:
        assert cookie not in stored


async def test_a_refused_sign_in_has_its_reason(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live(oidc_default_role="none")
    async with browser_session() as browser:
        assert (await sign_in(browser, live.url, "dave"))[0] == 401
        async with browser.get(live.url + "/auth/oidc/callback?state=forged&code=x") as resp:
            assert resp.status == 401
    found = await entries(live, action="auth.sign_in")
    assert [(e["user"]["id"], e["event"]["outcome"], e["event"]["reason"]) for e in found] == [
        ("dave", "failure", "no_organization"),
        (None, "failure", "state_unknown"),
    ]


async def test_a_user_disabled_at_the_provider(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live(recheck_interval=RECHECK)
    async with browser_session() as browser:
        assert (await sign_in(browser, live.url, "bob"))[0] == 200
        own = {"Origin": live.url}
        async with browser.post(live.url + "/api/v1/keys", json={"name": "ci"}, headers=own) as r:
            assert r.status == 201
        live.provider.disable("bob")
        deadline = time.monotonic() + RECHECK + 10
        while True:
            async with browser.get(live.url + "/api/v1/users/me") as resp:
                if resp.status == 401:
                    break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        live.provider.users["bob"].disabled = False
        live.provider.write_users()
        assert (await sign_in(browser, live.url, "bob"))[0] == 200
    found = [e for e in await entries(live, target="bob") if e["event"]["action"] != "member.set"]
    assert summary(found) == [
        ("key.create", "bob", "success", "oidc"),
        ("auth.session_end", None, "success", "system"),
        ("key.suspend", None, "success", "system"),
        ("key.restore", None, "success", "system"),
    ]
    assert found[1]["acs"]["details"] == {"reason": "provider_refused"}
