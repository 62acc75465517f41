"""The URLs clients are given for a sandbox's ports (`exposed_urls`, `conversation_url`, a start
task's `agent_server_url`): the published host port, or the control plane's sandbox proxy.

The proxy's path scheme is defined here, where links are made, and served by
controlplane/proxy/routes.py: `/sandboxes/{sandbox_id}/proxy/{port}/{path}`, where `port` is
`agent` (the agent server), a port name of the spec's `exposed_ports` (`VSCODE`, any case) or
the container port's number (`8000`). The agent server's link has no trailing slash, as clients
append `/api/…` to it; any other port's ends with `/`, as a web application's pages expect.

Which one (ACS_SANDBOX_URLS): `direct` gives `http://ACS_URL_HOST:<host port>`, reachable from
the control plane's host only in the default set-up; `proxy` gives `ACS_PROXY_URL/sandboxes/…`,
reachable wherever the control plane is; `auto` (the default) is `proxy` once ACS_PROXY_URL is
set. The control plane itself always calls a sandbox at its direct address.
"""

from __future__ import annotations

from controlplane.config import ServiceConfig
from controlplane.sandboxes.models import SandboxRecord
from controlplane.specs.models import AGENT_SERVER

PROXY_ROOT = "/sandboxes"
AGENT_PORT = "agent"
"""The `port` segment naming the agent server (AGENT_SERVER in the spec)."""


def proxied(config: ServiceConfig) -> bool:
    """True when clients get links through the proxy."""
    return config.sandbox_urls == "proxy" or (
        config.sandbox_urls == "auto" and config.proxy_url is not None
    )


def proxy_prefix(sandbox_id: str, port: str) -> str:
    """The path every request for `port` of the sandbox starts with."""
    return f"{PROXY_ROOT}/{sandbox_id}/proxy/{port}"


def direct_url(config: ServiceConfig, record: SandboxRecord, name: str) -> str:
    """The exposed port `name` as this control plane reaches it: at the host the driver
    recorded for the sandbox, else ACS_URL_HOST."""
    return f"http://{record.host or config.url_host}:{record.ports[name]}"


def port_url(config: ServiceConfig, record: SandboxRecord, name: str) -> str:
    """The link clients get for the exposed port `name` (which must be in record.ports)."""
    if not proxied(config):
        return direct_url(config, record, name)
    if name == AGENT_SERVER:
        return f"{config.proxy_url}{proxy_prefix(record.id, AGENT_PORT)}"
    return f"{config.proxy_url}{proxy_prefix(record.id, name)}/"


def agent_url(config: ServiceConfig, record: SandboxRecord) -> str:
    """The agent server's base URL as clients reach it."""
    return port_url(config, record, AGENT_SERVER)
