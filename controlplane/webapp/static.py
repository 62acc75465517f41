"""ACS_WEB_APP_DIR: a built single-page app (Agent Canvas's `build/`) served at `/`.

Served from this origin, Agent Canvas runs in its "locked to one cloud, cookie auth" mode: the
index page gets `window.__AGENT_CANVAS_LOCK_TO_CLOUD__ = <this origin>` (what Canvas's own static
server injects for `--lock-to-cloud`), so the app talks to this server with the browser session
cookie and needs no key of its own. The files are public (they hold no user data); what the app
then reads needs a session like every API call.

Paths of the API and of our own pages are never answered with the app: an unknown `/api/…` path
stays a JSON 404.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from controlplane.api.routing import Handler

#: Paths the app never shadows: the API, our pages, the agent-server socket path, probes.
RESERVED = ("/api/", "/auth/", "/oauth/", "/sockets/", "/health", "/ready", "/metrics", "/login")
ASSET_CACHE = "public, max-age=31536000, immutable"
LOCK_KEY = "__AGENT_CANVAS_LOCK_TO_CLOUD__"


def _origin(request: web.Request) -> str:
    forwarded = request.headers.get("X-Forwarded-Proto", "").lower()
    scheme = "https" if request.secure or forwarded == "https" else "http"
    return f"{scheme}://{request.host}"


def injected_index(html: str, origin: str) -> str:
    """index.html with the lock-to-cloud global set before any app code runs."""
    literal = json.dumps(origin).replace("<", "\\u003c")
    script = f"<script>window.{LOCK_KEY}={literal};</script>"
    if "</head>" in html:
        return html.replace("</head>", f"{script}\n</head>", 1)
    return script + html


def web_app_handler(directory: Path) -> Handler:
    root = directory.resolve()
    index = root / "index.html"
    if not index.is_file():
        raise ValueError(f"{directory} has no index.html: not a built web app")
    page = index.read_text(encoding="utf-8")  # read once: the build does not change under us

    async def serve(request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info.get("path", "")
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPNotFound()  # the app's pages are read; any other method: no route
        if path.startswith(RESERVED) or path in {r.rstrip("/") for r in RESERVED}:
            raise web.HTTPNotFound()
        target = (root / path.lstrip("/")).resolve()
        if target != root and target.is_relative_to(root) and target.is_file():
            if target == index:
                return _index(request, page)
            response = web.FileResponse(target)
            immutable = target.is_relative_to(root / "assets")
            response.headers["Cache-Control"] = ASSET_CACHE if immutable else "no-cache"
            response.headers["X-Content-Type-Options"] = "nosniff"
            return response
        if "." in path.rsplit("/", 1)[-1]:
            raise web.HTTPNotFound()  # a missing asset, not a page of the app
        return _index(request, page)

    serve.acs_public = True  # type: ignore[attr-defined]
    return serve


def _index(request: web.Request, page: str) -> web.Response:
    html = injected_index(page, _origin(request))
    return web.Response(
        text=html,
        content_type="text/html",
        headers={
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
        },
    )


def register_web_app(app: web.Application, directory: Path) -> None:
    """Serve `directory` for every GET no API route takes; call after every other route."""
    handler = web_app_handler(directory)
    app.router.add_route("*", "/{path:.*}", handler)
