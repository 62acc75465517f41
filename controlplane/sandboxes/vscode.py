"""The `VSCODE` entry of a sandbox's exposed_urls, as OpenHands writes it: the port's URL with
`?tkn=<session key>&folder=<working dir>` (openvscode-server's connection token and the folder
to open), which the web frontend's Code tab opens. A spec offers VS Code by exposing a port named
VSCODE (for the official agent server: `openhands: {vscode: true}` and `VSCODE: 8001`; our
agent server has none, docs/sandboxes.md). The token is the owner's session key, which only the
owner is shown: anyone else gets the URL without it."""

from __future__ import annotations

from urllib.parse import urlencode

VSCODE = "VSCODE"


def exposed_url(name: str, base: str, session_key: str | None, working_dir: str | None) -> str:
    """The URL of exposed port `name` at `base` (http://host:port)."""
    if name != VSCODE:
        return base
    query = {"tkn": session_key} if session_key else {}
    if working_dir:
        query["folder"] = working_dir
    return f"{base}/?{urlencode(query)}" if query else base
