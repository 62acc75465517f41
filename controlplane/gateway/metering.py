"""Budgets checked before a call is forwarded, usage recorded after it, in Redis (shared by
every replica).

Cost = the provider's reported prompt tokens * input price + completion tokens * output price,
with the prices of ACS_LLM_PRICES (the table the control plane already uses for the agents'
own accounting), looked up by the configured model, then without its provider prefix; a model
without a price there is priced by LiteLLM's table when the translator served it, else 0 (and
counted in acs_llm_unpriced_calls_total: a budget cannot bound what it cannot price).

A conversation's budget (`max_budget_per_task`) and the user's monthly budget
(ACS_LLM_USER_MONTHLY_BUDGET) are checked against what was recorded before the call: a call
that starts under budget runs to its end, the next one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.store import keys, text

USER_USAGE_TTL = 400 * 86400
"""A month's per-user usage is kept about 13 months (a year of history for reports)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    priced: bool = True


@dataclass(frozen=True)
class Spent:
    cost: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


def month(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m")


def price_of(prices: dict[str, tuple[float, float]], model: str) -> tuple[float, float] | None:
    if model in prices:
        return prices[model]
    _, sep, bare = model.partition("/")
    if sep and bare in prices:
        return prices[bare]
    return None


def cost_of(
    prices: dict[str, tuple[float, float]],
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    fallback: float | None = None,
) -> Usage:
    price = price_of(prices, model)
    if price is not None:
        cost = prompt_tokens * price[0] + completion_tokens * price[1]
        return Usage(prompt_tokens, completion_tokens, cost, True)
    if fallback is not None:
        return Usage(prompt_tokens, completion_tokens, fallback, True)
    return Usage(prompt_tokens, completion_tokens, 0.0, False)


def _spent(row: list[bytes | str | None]) -> Spent:
    cost, prompt, completion, requests = (text(v) if v is not None else "0" for v in row)
    return Spent(float(cost), int(prompt), int(completion), int(requests))


FIELDS = ["cost", "prompt_tokens", "completion_tokens", "requests"]


class Meter:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def spent(self, user_id: str, conversation_id: str | None) -> tuple[Spent, Spent]:
        """(the conversation's, the user's this month) in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.llm_usage_user(user_id, month()), FIELDS)
            if conversation_id is not None:
                pipe.hmget(keys.llm_usage_conversation(conversation_id), FIELDS)
            rows = await pipe.execute()
        user = _spent(rows[0])
        conversation = _spent(rows[1]) if conversation_id is not None else Spent()
        return conversation, user

    async def record(self, user_id: str, conversation_id: str | None, usage: Usage) -> None:
        user_key = keys.llm_usage_user(user_id, month())
        targets = [user_key]
        if conversation_id is not None:
            targets.append(keys.llm_usage_conversation(conversation_id))
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in targets:
                pipe.hincrbyfloat(key, "cost", usage.cost)
                pipe.hincrby(key, "prompt_tokens", usage.prompt_tokens)
                pipe.hincrby(key, "completion_tokens", usage.completion_tokens)
                pipe.hincrby(key, "requests", 1)
            pipe.expire(user_key, USER_USAGE_TTL)
            await pipe.execute()
