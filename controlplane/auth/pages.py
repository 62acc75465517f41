"""The small HTML pages a browser sees: sign in with an API key, approve a device code.

Plain forms, no script; every value is escaped. Served with a CSP that forbids scripts and
framing (an approval button in someone else's frame would be a clickjacking target).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from urllib.parse import quote

from aiohttp import web

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer, browsers send `Origin: null` on our own
    # form posts, which the cross-origin check must refuse.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_STYLE = """
body { font-family: system-ui, sans-serif; background: #f4f5f7; color: #1d2433; margin: 0; }
main { max-width: 28rem; margin: 4rem auto; background: #fff; padding: 2rem;
       border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.12); }
h1 { font-size: 1.4rem; margin-top: 0; }
label { display: block; font-weight: 600; margin: 1rem 0 .3rem; }
input[type=text], input[type=password] { width: 100%; box-sizing: border-box; padding: .5rem;
       font-size: 1rem; border: 1px solid #b8bfcc; border-radius: 4px; }
.code { font-family: ui-monospace, monospace; letter-spacing: .15em; text-transform: uppercase; }
button { margin-top: 1rem; padding: .5rem 1.2rem; font-size: 1rem; border-radius: 4px;
       border: 1px solid #2f5bd3; background: #2f5bd3; color: #fff; cursor: pointer; }
button.secondary { background: #fff; color: #2f5bd3; }
.error { background: #fdecec; border: 1px solid #e5a3a3; padding: .6rem; border-radius: 4px; }
a.button { display: inline-block; padding: .5rem 1.2rem; border-radius: 4px;
       background: #2f5bd3; color: #fff; text-decoration: none; }
.ok { background: #eaf7ee; border: 1px solid #9fd3ad; padding: .6rem; border-radius: 4px; }
"""


def page(title: str, body: str, status: int = 200) -> web.Response:
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Agent Conversation Service</title>"
        f"<style>{_STYLE}</style></head><body><main>{body}</main></body></html>"
    )
    return web.Response(
        text=html, status=status, content_type="text/html", headers=SECURITY_HEADERS
    )


def _notice(error: str | None, ok: str | None = None) -> str:
    if error:
        return f'<p class="error" role="alert">{escape(error)}</p>'
    if ok:
        return f'<p class="ok" role="status">{escape(ok)}</p>'
    return ""


@dataclass(frozen=True)
class SignInOptions:
    provider: str | None = None
    """The OpenID provider's display name when browsers may sign in through it."""
    api_key: bool = True


def sign_in_page(
    next_url: str,
    error: str | None = None,
    status: int = 200,
    options: SignInOptions | None = None,
) -> web.Response:
    options = options or SignInOptions()
    provider = ""
    if options.provider is not None:
        start = f"/auth/oidc/start?next={quote(next_url, safe='')}"
        provider = f"""
<p><a class="button" id="sign-in-oidc" href="{escape(start)}">Sign in with
{escape(options.provider)}</a></p>"""
    if not options.api_key:
        return page("Sign in", f"<h1>Sign in</h1>{_notice(error)}{provider}", status)
    body = f"""
<h1>Sign in</h1>
{_notice(error)}{provider}
<p>Sign in with one of your API keys (<code>controlplane keys create --user NAME</code> prints
one). Your browser then keeps a session cookie; the key itself is not stored in the browser.</p>
<form method="post" action="/auth/sign-in">
  <label for="api_key">API key</label>
  <input id="api_key" name="api_key" type="password" autocomplete="current-password" required
         autofocus>
  <input type="hidden" name="next" value="{escape(next_url)}">
  <button type="submit" id="sign-in">Sign in</button>
</form>"""
    return page("Sign in", body, status)


def signed_in_page(user_id: str, next_url: str | None) -> web.Response:
    cont = f'<p><a href="{escape(next_url)}" id="continue">Continue</a></p>' if next_url else ""
    body = f"""
<h1>Signed in</h1>
<p id="who">You are signed in as <strong>{escape(user_id)}</strong>.</p>
{cont}
<form method="post" action="/auth/sign-out">
  <button type="submit" class="secondary" id="sign-out">Sign out</button>
</form>"""
    return page("Signed in", body)


def continue_page(next_url: str) -> web.Response:
    """After the provider's callback: the browser goes on from our own page, so the request to
    `next_url` is same-site and carries the SameSite=Strict session cookie (a redirect straight
    from the provider's cross-site navigation would not)."""
    target = escape(next_url)
    body = f"""
<h1>Signed in</h1>
<p><a href="{target}" id="continue">Continue</a></p>"""
    response = page("Signed in", body)
    response.headers["Refresh"] = f"0; url={next_url}"
    return response


def signed_out_page() -> web.Response:
    body = """
<h1>Signed out</h1>
<p id="who">Your browser session has ended.</p>
<p><a href="/auth/sign-in">Sign in again</a></p>"""
    return page("Signed out", body)


def verify_page(
    user_id: str, user_code: str, error: str | None = None, status: int = 200
) -> web.Response:
    body = f"""
<h1>Connect a device</h1>
<p>Signed in as <strong>{escape(user_id)}</strong>. A program (such as <code>openhands
login</code>) asks to act as you. Approve only if the code below is the one it shows you: it then
receives a new API key of yours.</p>
{_notice(error)}
<form method="post" action="/oauth/device/verify">
  <label for="user_code">Code</label>
  <input id="user_code" name="user_code" type="text" class="code" value="{escape(user_code)}"
         autocomplete="off" spellcheck="false" required>
  <button type="submit" name="action" value="approve" id="approve">Approve</button>
  <button type="submit" name="action" value="deny" class="secondary" id="deny">Deny</button>
</form>"""
    return page("Connect a device", body, status)


def decided_page(user_code: str, approved: bool) -> web.Response:
    if approved:
        text = f"Device {user_code} is connected. Return to your terminal; you can close this page."
    else:
        text = f"Request {user_code} was denied. The program gets no access."
    body = f"""
<h1>{"Device connected" if approved else "Request denied"}</h1>
{_notice(None, text)}"""
    return page("Device connected" if approved else "Request denied", body)
