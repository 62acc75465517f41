"""The `llm` block of an agent's start request: the gateway's URL and a sandbox token, or (for
a spec that opts out with `llm_gateway: false`) the user's provider settings as before."""

from __future__ import annotations

from typing import Any

from controlplane.gateway.credentials import SandboxTokens
from controlplane.specs.models import SandboxSpec

PATH = "/api/v1/llm-gateway"
"""Where the API and the webhook listener serve the gateway (routes.py)."""


def agent_llm(
    *,
    spec: SandboxSpec | None,
    model: str,
    base_url: str | None,
    api_key: str | None,
    prices: tuple[float | None, float | None],
    tokens: SandboxTokens | None,
    control_plane_url: str | None,
    sandbox_id: str,
    conversation_id: str,
    user_id: str,
) -> dict[str, Any]:
    common = {"input_cost_per_token": prices[0], "output_cost_per_token": prices[1]}
    through_gateway = spec is None or spec.llm_gateway
    if not through_gateway or tokens is None or control_plane_url is None:
        return {"model": model, "base_url": base_url, "api_key": api_key, **common}
    official = spec is not None and spec.agent_kind == "openhands"
    llm: dict[str, Any] = {
        # The official server's LiteLLM needs a provider: `openai/` makes it call the gateway
        # as an OpenAI-compatible server, sending `model` without that prefix.
        "model": f"openai/{model}" if official else model,
        "base_url": control_plane_url.rstrip("/") + PATH + "/v1",
        "api_key": tokens.issue(sandbox_id, conversation_id, user_id),
        **common,
    }
    if official:
        # The gateway speaks chat completions; left to itself, SDK 1.58 picks OpenAI's
        # Responses API for some model names (gpt-5, codex), which the gateway does not serve.
        llm["api_mode"] = "chat"
    return llm
