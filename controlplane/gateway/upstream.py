"""Where a gateway call goes: the user's model and `llm_base_url` decide.

A provider that already speaks the gateway's protocol (OpenAI chat completions) is called
directly: `openai/<model>` (api.openai.com, or `llm_base_url`), `litellm_proxy/<model>` (a LiteLLM
proxy at `llm_base_url`) and a bare name with `llm_base_url` (a self-hosted OpenAI-compatible
server: vLLM, llama.cpp, LM Studio, Ollama's /v1). Nothing is translated on that path, the body
is forwarded with only `model` replaced. Every other model (`anthropic/…`, `gemini/…`,
`openrouter/…`, `ollama/…`, `bedrock/…`, a bare known name such as `claude-…` or `gpt-4o`) goes
to the translator, a LiteLLM process next to the control plane (translator.py), which resolves
the provider, translates the request and the answer, and speaks OpenAI's protocol back.
ACS_LLM_GATEWAY_DIRECT=false sends everything through LiteLLM (docs/llm-gateway.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OPENAI_BASE_URL = "https://api.openai.com/v1"
#: Prefixes clients put in front of the model to make their own LiteLLM call us as an
#: OpenAI-compatible server: stripped when matching a request's model with the configured one.
CLIENT_PREFIXES = ("litellm_proxy/", "openai/")


class UpstreamError(Exception):
    """The settings name no usable upstream (the message says what to set)."""


@dataclass(frozen=True)
class Upstream:
    via: Literal["direct", "translator"]
    model: str
    """The model as the upstream wants it: the provider's (direct) or LiteLLM's (translator)."""
    base_url: str | None
    api_key: str | None
    provider: str
    """A label for metrics and logs: `openai`, `anthropic`, `openai_compatible`, ..."""


def provider_of(model: str) -> str:
    head, sep, _ = model.partition("/")
    return head.lower() if sep else "default"


def resolve(
    model: str, base_url: str | None, api_key: str | None, *, direct: bool = True
) -> Upstream:
    base = base_url.rstrip("/") if base_url else None
    if direct:
        if model.startswith("openai/"):
            return Upstream(
                "direct", model.removeprefix("openai/"), base or OPENAI_BASE_URL, api_key, "openai"
            )
        if model.startswith("litellm_proxy/"):
            if base is None:
                raise UpstreamError("a litellm_proxy/ model needs llm_base_url (the proxy's URL)")
            return Upstream(
                "direct", model.removeprefix("litellm_proxy/"), base, api_key, "litellm_proxy"
            )
        if "/" not in model and base is not None:
            return Upstream("direct", model, base, api_key, "openai_compatible")
    if "/" not in model and base is not None:
        # LiteLLM needs a provider: a bare name at a base URL is an OpenAI-compatible server.
        return Upstream("translator", f"openai/{model}", base, api_key, "openai_compatible")
    return Upstream("translator", model, base, api_key, provider_of(model))


def matches(requested: str, configured: str) -> bool:
    """Does a request's `model` name the configured one? As configured, without the prefix our
    agents' LiteLLM strips (`openai/`, `litellm_proxy/`, which we gave them), or as the provider
    knows it (the configured name without its provider prefix: what OpenHands' SDK sends for
    `openai/<provider>/<model>`). The credential decides the model either way: this only
    refuses a request for something else."""
    if requested in (configured, configured.partition("/")[2]):
        return True
    return any(
        requested.removeprefix(p) == configured for p in CLIENT_PREFIXES if requested.startswith(p)
    )
