"""The gateway's decisions for one call: who calls (credentials.py), for which model and
provider (upstream.py), within which limits (metering.py and the per-user rate limit), then
what it cost."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.api.ratelimit import RateLimiter
from controlplane.config import ServiceConfig
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.gateway.credentials import (
    MAX_CREDENTIAL,
    Caller,
    InvalidCredential,
    SandboxTokens,
    UserGatewayKeys,
    check_scope,
    looks_like_sandbox_token,
    looks_like_user_key,
)
from controlplane.gateway.forward import Forwarder, GatewayError, Metered, estimate_prompt
from controlplane.gateway.metering import Meter, Usage, cost_of
from controlplane.gateway.metrics import GatewayMetrics
from controlplane.gateway.upstream import Upstream, UpstreamError, matches, resolve
from controlplane.sandboxes.store import SandboxStore
from controlplane.settings.service import SettingsService

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Call:
    caller: Caller
    model: str
    """The configured model (the conversation's, or the user's settings')."""
    upstream: Upstream
    started: float


class GatewayService:
    def __init__(
        self,
        config: ServiceConfig,
        redis: aioredis.Redis,
        *,
        tokens: SandboxTokens,
        user_keys: UserGatewayKeys,
        settings: SettingsService,
        sandboxes: SandboxStore | None,
        forwarder: Forwarder,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self.tokens = tokens
        self.user_keys = user_keys
        self._settings = settings
        self._sandboxes = sandboxes
        self._conversations = ConversationStore(redis)
        self.forwarder = forwarder
        self.metrics = metrics
        self.meter = Meter(redis)
        self.prices = config.llm_prices
        self.monthly_budget = config.llm_user_monthly_budget
        self.max_body_bytes = config.llm_gateway_max_body_bytes
        per_minute = config.llm_rate_limit_per_minute
        self._limiter = RateLimiter(redis, per_minute) if per_minute else None

    # --- who is calling ---------------------------------------------------------------

    async def authenticate(self, presented: str | None) -> Caller:
        """The caller of a credential, checked against Redis now. Raises GatewayError 401."""
        if not presented or len(presented) > MAX_CREDENTIAL:
            raise GatewayError(401, "invalid_api_key", "missing or malformed gateway credential")
        try:
            if looks_like_sandbox_token(presented):
                return await self._sandbox_caller(presented)
            if looks_like_user_key(presented):
                return await self.user_keys.authenticate(presented)
        except InvalidCredential as exc:
            raise GatewayError(401, "invalid_api_key", str(exc)) from None
        raise GatewayError(401, "invalid_api_key", "not an LLM gateway credential")

    async def _sandbox_caller(self, presented: str) -> Caller:
        ids = self.tokens.parse(presented)
        if ids is None or self._sandboxes is None:
            raise InvalidCredential("invalid gateway credential")
        sandbox_id, conversation_id = ids
        sandbox, conversation = await asyncio.gather(
            self._sandboxes.get(sandbox_id), self._conversations.get(conversation_id)
        )
        info = check_scope(sandbox, conversation, sandbox_id)
        return Caller(
            user_id=info.created_by_user_id or "",
            conversation_id=info.id,
            sandbox_id=sandbox_id,
            model=info.llm_model,
        )

    # --- before forwarding ------------------------------------------------------------

    async def admit(self, caller: Caller, requested: Any) -> Call:
        """Model, provider, rate limit and budgets for one call. Raises GatewayError."""
        record = await self._settings.record(caller.user_id)
        model = caller.model or record.settings.llm_model
        if not model:
            raise GatewayError(400, "model_not_configured", "no llm_model in the user's settings")
        if not isinstance(requested, str) or not matches(requested, model):
            raise GatewayError(
                404,
                "model_not_found",
                f"this credential may call {model!r} only (GET /v1/models), not {requested!r}",
            )
        if not record.llm_api_key and not record.settings.llm_base_url:
            raise GatewayError(400, "no_llm_key", "no llm_api_key in the user's settings")
        try:
            upstream = resolve(
                model,
                record.settings.llm_base_url,
                record.llm_api_key,
                direct=self._config.llm_gateway_direct,
            )
        except UpstreamError as exc:
            raise GatewayError(400, "model_not_routable", str(exc)) from None
        await self._check_limits(caller, record.settings.max_budget_per_task)
        return Call(caller, model, upstream, time.perf_counter())

    async def _check_limits(self, caller: Caller, settings_budget: float | None) -> None:
        budget_task = settings_budget if caller.conversation_id is not None else None
        budget_user = self._config.llm_user_monthly_budget
        checks: list[Any] = [self.meter.spent(caller.user_id, caller.conversation_id)]
        if self._limiter is not None:
            checks.append(self._limiter.hit(f"llm:{caller.user_id}"))
        results = await asyncio.gather(*checks)
        (conversation, user), decision = results[0], results[1] if len(results) > 1 else None
        if decision is not None and not decision.allowed:
            self.metrics.refused.labels(reason="rate_limit").inc()
            raise GatewayError(
                429,
                "rate_limit_exceeded",
                f"rate limit of {decision.limit} LLM calls per minute for this user reached",
                retry_after=decision.reset_after,
            )
        if budget_task is not None and conversation.cost >= budget_task:
            self.metrics.refused.labels(reason="task_budget").inc()
            raise GatewayError(
                400,
                "budget_exceeded",
                f"BudgetExceeded: this conversation's LLM cost ${conversation.cost:.6f} reached "
                f"its budget of ${budget_task:.6f} (max_budget_per_task)",
            )
        if budget_user is not None and user.cost >= budget_user:
            self.metrics.refused.labels(reason="user_budget").inc()
            raise GatewayError(
                400,
                "budget_exceeded",
                f"BudgetExceeded: the user's LLM cost this month ${user.cost:.6f} reached the "
                f"monthly budget of ${budget_user:.6f}",
            )

    # --- after ------------------------------------------------------------------------

    async def settle(
        self, call: Call, body: dict[str, Any], metered: Metered, status: int
    ) -> Usage:
        """Record what the call cost (what the provider reported, else an estimate) and
        observe it."""
        provider = call.upstream.provider
        prompt, completion = metered.prompt_tokens, metered.completion_tokens
        if not metered.reported and status < 400:
            prompt = estimate_prompt(body)
            completion = metered.streamed_chars // 4
            self.metrics.estimated.labels(provider=provider).inc()
        usage = cost_of(self._config.llm_prices, call.model, prompt, completion, metered.cost)
        if status < 400:
            await self.meter.record(call.caller.user_id, call.caller.conversation_id, usage)
            if not usage.priced:
                self.metrics.unpriced.labels(provider=provider).inc()
        self.metrics.observe(
            provider=provider,
            status=status,
            seconds=time.perf_counter() - call.started,
            usage=usage,
            errors=metered.errors,
        )
        log.info(
            "llm_gateway_call",
            user_id=call.caller.user_id,
            conversation_id=call.caller.conversation_id,
            caller=call.caller.label,
            provider=provider,
            via=call.upstream.via,
            status=status,
            attempts=metered.attempts,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cost=round(usage.cost, 8),
            ms=round((time.perf_counter() - call.started) * 1000, 2),
        )
        return usage

    async def conversation(self, conversation_id: str) -> AppConversationInfo | None:
        return await self._conversations.get(conversation_id)

    async def configured_model(self, caller: Caller) -> str | None:
        if caller.model:
            return caller.model
        return (await self._settings.record(caller.user_id)).settings.llm_model
