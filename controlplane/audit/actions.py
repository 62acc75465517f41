"""Which action each state-changing route is (and the OpenID provider's callback, a GET that
signs in), for the audit log: one table, so that a route added without its action fails a test
(tests/audit/test_route_actions.py) instead of going unrecorded.

Keys are (method, canonical path): the route's path with its patterns left out, as aiohttp
names a resource (`/api/v1/sandboxes/{sandbox_id}/pause`). A route's entry carries the ids in
its path as targets (`sandbox_id`, `org_id`, …) and `name` where the path names a profile or a
secret (a name, never what it holds).
"""

from __future__ import annotations

import re

from controlplane.store.audit import AuditAction

A = AuditAction

ROUTE_ACTIONS: dict[tuple[str, str], AuditAction] = {
    ("POST", "/auth/sign-in"): A.SIGN_IN,
    ("GET", "/auth/oidc/callback"): A.SIGN_IN,
    ("POST", "/auth/sign-out"): A.SIGN_OUT,
    ("POST", "/oauth/device/verify"): A.DEVICE_DECIDE,
    ("POST", "/api/settings"): A.SETTINGS_UPDATE,
    ("POST", "/api/v1/settings"): A.SETTINGS_UPDATE,
    ("POST", "/api/add-git-providers"): A.PROVIDERS_UPDATE,
    ("POST", "/api/unset-provider-tokens"): A.PROVIDERS_UNSET,
    ("POST", "/api/secrets"): A.SECRET_CREATE,
    ("PUT", "/api/secrets/{name}"): A.SECRET_UPDATE,
    ("DELETE", "/api/secrets/{name}"): A.SECRET_DELETE,
    ("POST", "/api/v1/sandboxes"): A.SANDBOX_CREATE,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/pause"): A.SANDBOX_PAUSE,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/resume"): A.SANDBOX_RESUME,
    ("DELETE", "/api/v1/sandboxes/{sandbox_id}"): A.SANDBOX_DELETE,
    ("DELETE", "/api/v1/sandboxes"): A.SANDBOX_DELETE,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/snapshots"): A.SNAPSHOT_CREATE,
    ("DELETE", "/api/v1/snapshots/{snapshot_id}"): A.SNAPSHOT_DELETE,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/fork"): A.SANDBOX_FORK,
    ("POST", "/api/v1/app-conversations/{conversation_id}/rewind"): A.CONVERSATION_REWIND,
    ("POST", "/api/v1/app-conversations/{conversation_id}/fork"): A.CONVERSATION_FORK,
    ("POST", "/api/v1/app-conversations"): A.CONVERSATION_START,
    ("POST", "/api/v1/app-conversations/stream-start"): A.CONVERSATION_START,
    ("POST", "/api/conversations"): A.CONVERSATION_START,
    ("PATCH", "/api/v1/app-conversations/{conversation_id}"): A.CONVERSATION_UPDATE,
    ("PATCH", "/api/conversations/{conversation_id}"): A.CONVERSATION_UPDATE,
    ("DELETE", "/api/v1/app-conversations/{conversation_id}"): A.CONVERSATION_DELETE,
    ("DELETE", "/api/conversations/{conversation_id}"): A.CONVERSATION_DELETE,
    ("POST", "/api/v1/app-conversations/{conversation_id}/events"): A.CONVERSATION_MESSAGE,
    (
        "POST",
        "/api/v1/app-conversations/{conversation_id}/respond_to_confirmation",
    ): A.CONVERSATION_CONFIRM,
    ("POST", "/api/v1/app-conversations/{conversation_id}/pause"): A.CONVERSATION_AGENT_PAUSE,
    ("POST", "/api/v1/app-conversations/{conversation_id}/run"): A.CONVERSATION_AGENT_RUN,
    ("POST", "/api/v1/conversations/{conversation_id}/pending-messages"): A.PENDING_QUEUE,
    (
        "POST",
        "/api/v1/conversations/{conversation_id}/pending-messages/deliver",
    ): A.PENDING_DELIVER,
    ("POST", "/api/v1/websocket-tickets"): A.TICKET_CREATE,
    ("POST", "/api/keys/llm/byor/refresh"): A.GATEWAY_KEY_REFRESH,
    ("DELETE", "/api/keys/llm/byor"): A.GATEWAY_KEY_REVOKE,
    ("POST", "/api/v1/settings/profiles/{name}"): A.PROFILE_SAVE,
    ("DELETE", "/api/v1/settings/profiles/{name}"): A.PROFILE_DELETE,
    ("POST", "/api/v1/settings/profiles/{name}/rename"): A.PROFILE_RENAME,
    ("POST", "/api/v1/settings/profiles/{name}/activate"): A.PROFILE_ACTIVATE,
    ("POST", "/api/organizations/{org_id}/profiles/{name}"): A.PROFILE_SAVE,
    ("DELETE", "/api/organizations/{org_id}/profiles/{name}"): A.PROFILE_DELETE,
    ("POST", "/api/organizations/{org_id}/profiles/{name}/rename"): A.PROFILE_RENAME,
    ("POST", "/api/organizations/{org_id}/profiles/{name}/activate"): A.PROFILE_ACTIVATE,
    ("POST", "/api/organizations"): A.ORG_CREATE,
    ("PATCH", "/api/organizations/{org_id}"): A.ORG_UPDATE,
    ("PUT", "/api/organizations/{org_id}/members/{user_id}"): A.MEMBER_SET,
    ("DELETE", "/api/organizations/{org_id}/members/{user_id}"): A.MEMBER_REMOVE,
    ("POST", "/api/organizations/{org_id}/switch"): A.ORG_SWITCH,
    ("POST", "/api/v1/keys"): A.KEY_CREATE,
    ("DELETE", "/api/v1/keys/{key_id}"): A.KEY_REVOKE,
    ("POST", "/api/agent-profiles/{name}/activate"): A.AGENT_PROFILE_CHANGE,
    ("POST", "/api/agent-profiles/{name}"): A.AGENT_PROFILE_CHANGE,
    ("DELETE", "/api/agent-profiles/{name}"): A.AGENT_PROFILE_CHANGE,
    ("POST", "/api/agent-profiles/{name}/rename"): A.AGENT_PROFILE_CHANGE,
    ("POST", "/api/cloud-proxy"): A.SANDBOX_CALL,
}

NOT_AUDITED: dict[tuple[str, str], str] = {
    ("POST", "/oauth/device/authorize"): "a device asks for a code: nobody acted yet; the "
    "user's decision (auth.device_decide) and the key it yields (key.create) are recorded",
    ("POST", "/oauth/device/token"): "a device polls; the key an approved code yields is "
    "recorded as key.create",
    ("POST", "/api/authenticate"): "a check of the caller's credential: it changes nothing",
    ("POST", "/api/v1/webhooks/{sandbox_id}/events/{conversation_id}"): "a sandbox's own "
    "report (its session key, not a user): lifecycle and conversation events record it",
    ("POST", "/api/v1/webhooks/{sandbox_id}/conversations"): "a sandbox's own report",
    ("POST", "/api/v1/webhooks/{sandbox_id}/ready"): "a sandbox's own report (lifecycle events)",
    ("POST", "/api/v1/llm-gateway/v1/chat/completions"): "a model call from a sandbox: metered "
    "in usage (GET /api/v1/llm-gateway/usage), not a change of the service's state",
    ("POST", "/api/v1/llm-gateway/chat/completions"): "a model call: metered in usage",
}
"""State-changing routes without an entry, and why (a route's own traffic into a sandbox, the
proxy's, is neither: it is the sandbox's, under /sandboxes/{id}/proxy/)."""

NOT_AUDITED_PREFIXES = ("/sandboxes/{sandbox_id}/proxy/",)
"""Traffic to the apps in a user's sandbox: their own requests, not the control plane's."""

_PATTERN = re.compile(r"\{(\w+)(?::[^{}]*)?\}")


def canonical(path: str) -> str:
    """A route path as aiohttp's resource names it: `{name:regex}` → `{name}`."""
    return _PATTERN.sub(r"{\1}", path)


def action_of(method: str, canonical_path: str) -> AuditAction | None:
    return ROUTE_ACTIONS.get((method, canonical_path))
