"""What an answer from a sandbox may carry back to a client through the control plane.

A sandbox's HTTP answer is written by code the agent controls (a dev server, or a replaced agent
server: the agent's commands run as the same user), and it reaches the browser on the control
plane's own origin: through the sandbox proxy (controlplane/proxy/) and the routes that relay an
agent server's answer (sandboxes/runtime_http.py: the cloud proxy, a conversation's git and file
reads). So such an answer may describe itself, never act on our origin. The rule, header by
header (docs/security.md#what-a-sandbox-answer-may-carry says why for each):

- dropped, `ORIGIN_WIDE`: headers whose effect outlives the answer or reaches beyond it, over
  the whole origin or host: cookies, storage wiping, transport and connection policy, reporting
  endpoints (which would receive URLs with keys in them), client hints, service-worker scope,
  login status, credential prompts;
- dropped, prefixed `access-control-`: CORS speaks for our origin (ACS_CORS_ORIGINS decide);
- dropped, the sandbox's own Content-Security-Policy and Referrer-Policy: ours replace them
  (a page runs in an opaque origin and sends no URL of ours to another site);
- rewritten, Cache-Control: never `public` or `s-maxage` (a shared cache would hand one user's
  authenticated answer to anyone), always `private`;
- added, `ANSWER_HEADERS`.
"""

from __future__ import annotations

from collections.abc import Iterable

ORIGIN_WIDE = frozenset(
    {
        "set-cookie",  # a jar of our origin: planted, overwritten, or overflowed (evicting ours)
        "set-cookie2",
        "clear-site-data",  # wipes our cookies, storage and caches
        "strict-transport-security",  # host-wide, for up to years (breaks plain-HTTP installs)
        "public-key-pins",
        "public-key-pins-report-only",
        "expect-ct",
        "alt-svc",  # sends later connections to our origin elsewhere
        "nel",  # network error reports of our whole origin, URLs included
        "report-to",
        "reporting-endpoints",
        "content-security-policy",  # replaced by ours; its report-uri would get our URLs
        "content-security-policy-report-only",
        "referrer-policy",  # replaced by ours: `unsafe-url` would send keys in URLs elsewhere
        "service-worker-allowed",  # widens what a service worker may control
        "accept-ch",  # client hints for the whole origin, remembered
        "accept-ch-lifetime",
        "critical-ch",
        "origin-agent-cluster",  # origin-wide agent clustering
        "set-login",  # FedCM login status of the origin
        "www-authenticate",  # a credentials prompt in our origin's name
        "timing-allow-origin",  # speaks for our origin to others
        "cdn-cache-control",  # tells shared caches in front of us to keep the answer
        "surrogate-control",
        "speculation-rules",
        "supports-loading-mode",
    }
)
CSP = (
    "sandbox allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox "
    "allow-modals allow-downloads"
)
"""A page a sandbox serves runs in an opaque origin: its scripts cannot use our cookies or
storage, nor call the API as the user."""
ANSWER_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_SHARED_CACHE = frozenset({"public", "s-maxage", "proxy-revalidate"})


def dropped(name: str) -> bool:
    """Whether a header of a sandbox's answer must not reach the client (`name`: any case)."""
    lowered = name.lower()
    return lowered in ORIGIN_WIDE or lowered.startswith("access-control-")


def private_cache_control(value: str) -> str:
    """The sandbox's Cache-Control for the user's browser only: shared-cache directives removed,
    `private` added (unless the answer is not to be stored at all)."""
    kept = [
        d.strip()
        for d in value.split(",")
        if d.strip() and d.split("=", 1)[0].strip().lower() not in _SHARED_CACHE
    ]
    names = {d.split("=", 1)[0].strip().lower() for d in kept}
    if "no-store" not in names and "private" not in names:
        kept.append("private")
    return ", ".join(kept)


def filtered(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A sandbox's answer headers, as they may reach the client (`ANSWER_HEADERS` not added)."""
    return [
        (name, private_cache_control(value) if name.lower() == "cache-control" else value)
        for name, value in headers
        if not dropped(name)
    ]
