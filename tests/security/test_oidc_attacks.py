"""Attacks on the OpenID sign-in, from where attackers are: a forged or stolen callback
(unauthenticated traffic), a replayed code, and ID tokens a hostile party (or a compromised
client of the same provider) could put in front of us: a wrong nonce, another audience,
`alg: none`, an expired token, an unknown key, an HMAC signed with the client secret. The tokens
are made with the real provider's own signing key (the fixture holds it), so every refusal below
is for the one claim or header that is wrong."""

from __future__ import annotations

import base64
import json
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey
from yarl import URL

from controlplane.auth.oidc import OidcClient, OidcSettings, SignInFailed
from tests.support.oidc_provider import CLIENT_ID, OTHER_CLIENT_ID, new_signing_key
from tests.support.oidc_sign_in import OidcLive, browser_session

pytestmark = pytest.mark.timeout(120)


async def _stop_before_callback(browser: aiohttp.ClientSession, live: OidcLive, user: str) -> str:
    async with browser.get(live.url + "/auth/oidc/start") as login_page:
        html = await login_page.text()
        action = html.split('action="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
        target = str(login_page.url.join(URL(action)))
    url = target
    data: dict[str, str] | None
    method, data = "POST", {"prompt": "login", "login": user, "password": "any"}
    for _ in range(10):
        async with browser.request(method, url, data=data, allow_redirects=False) as hop:
            location = hop.headers.get("Location")
            assert location, await hop.text()
            url = str(hop.url.join(URL(location)))
        if url.startswith(live.url + "/auth/oidc/callback"):
            return url
        method, data = "GET", None
    raise AssertionError("the provider never sent the browser back")


async def _status(browser: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with browser.get(url, allow_redirects=False) as response:
        return response.status, await response.text()


def _session_cookie(browser: aiohttp.ClientSession) -> bool:
    return any(c.key == "acs_session" for c in browser.cookie_jar)


async def test_a_forged_state_opens_no_session(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live()
    async with browser_session() as browser:
        status, html = await _status(
            browser, live.url + "/auth/oidc/callback?state=forged&code=whatever"
        )
        assert status == 401
        assert "unknown, expired or already used" in html
        assert not _session_cookie(browser)
        status, _ = await _status(browser, live.url + "/auth/oidc/callback?error=access_denied")
        assert status == 401


async def test_a_stolen_callback_works_only_in_the_browser_that_started(oidc_live: Any) -> None:
    live: OidcLive = await oidc_live()
    async with browser_session() as victim, browser_session() as attacker:
        callback = await _stop_before_callback(victim, live, "alice")
        status, html = await _status(attacker, callback)
        assert status == 401
        assert "another browser" in html
        assert not _session_cookie(attacker)
        # The attacker's try did not spoil the victim's sign-in ...
        status, _ = await _status(victim, callback)
        assert status == 200
        assert _session_cookie(victim)
        # ... and the code and state are single-use: a replay finds nothing.
        status, html = await _status(victim, callback)
        assert status == 401
        assert "unknown, expired or already used" in html


@pytest.fixture
async def client_and_key(oidc_live: Any) -> tuple[OidcClient, OidcLive, RSAKey]:
    live: OidcLive = await oidc_live()
    client = OidcClient(
        OidcSettings(
            issuer=live.provider.issuer,
            client_id=CLIENT_ID,
            client_secret=live.provider.client_secret,
            scopes=("openid",),
        )
    )
    return client, live, RSAKey.import_key(live.provider.keys[0])


def _claims(live: OidcLive, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": live.provider.issuer,
        "sub": "alice",
        "aud": CLIENT_ID,
        "iat": now,
        "exp": now + 300,
        "nonce": "the-nonce",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def _signed(key: RSAKey, claims: dict[str, Any], alg: str = "RS256") -> str:
    return jwt.encode({"alg": alg, "kid": key.kid}, claims, key)


async def test_a_good_token_passes_and_each_bad_claim_is_refused(
    client_and_key: tuple[OidcClient, OidcLive, RSAKey],
) -> None:
    client, live, key = client_and_key
    good = await client.validate_id_token(_signed(key, _claims(live)), nonce="the-nonce")
    assert good["sub"] == "alice"  # the control: only the one wrong thing below differs
    bad = {
        "wrong nonce": (_claims(live, nonce="another"), "the-nonce"),
        "no nonce": (_claims(live, nonce=None), "the-nonce"),
        "another audience": (_claims(live, aud=OTHER_CLIENT_ID), "the-nonce"),
        "another issuer": (_claims(live, iss="http://127.0.0.1:1"), "the-nonce"),
        "expired": (_claims(live, iat=int(time.time()) - 7200, exp=int(time.time()) - 3600),
                    "the-nonce"),
        "azp of another client": (_claims(live, azp=OTHER_CLIENT_ID), "the-nonce"),
    }  # fmt: skip
    for name, (claims, nonce) in bad.items():
        try:
            await client.validate_id_token(_signed(key, claims), nonce=nonce)
        except SignInFailed:
            continue
        pytest.fail(f"an ID token with {name} was accepted")


async def test_unsigned_hmac_and_unknown_key_tokens_are_refused(
    client_and_key: tuple[OidcClient, OidcLive, RSAKey],
) -> None:
    client, live, _key = client_and_key
    claims = _claims(live)
    # Made by hand: the library (rightly) refuses to make one.
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."
    with pytest.raises(SignInFailed):
        await client.validate_id_token(unsigned, nonce="the-nonce")
    # HS256 keyed with the client secret: what a provider's other client (or anyone who read
    # the secret) could make; never an ID token to us.
    secret = OctKey.import_key(live.provider.client_secret.encode())
    hmac_token = jwt.encode({"alg": "HS256"}, claims, secret, algorithms=["HS256"])
    with pytest.raises(SignInFailed):
        await client.validate_id_token(hmac_token, nonce="the-nonce")
    # A key of the attacker's own, with a kid the provider never published.
    foreign = RSAKey.import_key(new_signing_key())
    with pytest.raises(SignInFailed):
        await client.validate_id_token(_signed(foreign, claims), nonce="the-nonce")
    # Its kid claimed as the provider's: the signature does not verify.
    forged = jwt.encode({"alg": "RS256", "kid": live.provider.keys[0]["kid"]}, claims, foreign)
    with pytest.raises(SignInFailed):
        await client.validate_id_token(forged, nonce="the-nonce")


async def test_a_provider_naming_another_issuer_is_not_trusted(
    client_and_key: tuple[OidcClient, OidcLive, RSAKey],
) -> None:
    _client, live, _key = client_and_key
    host = urlsplit(live.provider.issuer)
    liar = OidcClient(
        OidcSettings(
            issuer=f"http://localhost:{host.port}",  # discovery there names 127.0.0.1
            client_id=CLIENT_ID,
            client_secret=live.provider.client_secret,
            scopes=("openid",),
        )
    )
    with pytest.raises(Exception, match="names issuer"):
        await liar.authorization("http://127.0.0.1/cb")
