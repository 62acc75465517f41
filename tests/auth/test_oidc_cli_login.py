"""`openhands login --server-url …` (the pinned CLI 1.16.0) through the device flow, its
approval page reached by signing in through the OpenID provider: the key it receives is the
provider user's, listed and revocable by them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.oidc_sign_in import OidcLive, browser_session, sign_in
from tests.support.openhands_clients import OpenHandsVenv, approve_code, openhands_login

pytestmark = [pytest.mark.slow, pytest.mark.clients, pytest.mark.timeout(300)]


async def approve_through_the_provider(base: str, user: str, link: str) -> None:
    """A person with the printed link: our page sends them to sign in, they choose the
    provider, log in there, come back to the code and press Approve."""
    async with browser_session() as browser:
        async with browser.get(link, allow_redirects=False) as page:
            assert page.status == 303
            assert page.headers["Location"].startswith("/auth/sign-in?next=")
        status, html = await sign_in(browser, base, user, link.removeprefix(base))
        assert status == 200, html
        await approve_code(browser, base, link)


async def test_openhands_login_signs_in_through_the_provider(
    openhands_venv: OpenHandsVenv, oidc_live: Any, tmp_path: Path
) -> None:
    live: OidcLive = await oidc_live(device_poll_interval=1)
    home = tmp_path / "home"
    home.mkdir()

    async def approve(link: str) -> None:
        await approve_through_the_provider(live.url, "alice", link)

    out = await openhands_login(openhands_venv, live.url, "", home, within=120, approve=approve)
    assert "Logged into OpenHands Cloud" in out, out
    stored = (home / ".openhands" / "cloud" / "api_key.txt").read_text().strip()
    assert stored.startswith("acs_")
    headers = {"Authorization": f"Bearer {stored}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(live.url + "/api/v1/users/me", headers=headers) as me:
            assert (await me.json())["id"] == "alice"
        async with http.get(live.url + "/api/v1/keys", headers=headers) as listed:
            (key,) = (await listed.json())["items"]
        assert key["key_id"] == stored.split("_")[1]
        async with http.delete(live.url + f"/api/v1/keys/{key['key_id']}", headers=headers) as r:
            assert r.status == 200
        async with http.get(live.url + "/api/v1/users/me", headers=headers) as me:
            assert me.status == 401
