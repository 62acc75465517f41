"""Budgets checked before a call is forwarded, usage recorded after it, in Redis (shared by
every replica).

Cost = the provider's reported prompt tokens * input price + completion tokens * output price,
with the prices of ACS_LLM_PRICES (the table the control plane already uses for the agents'
own accounting), looked up by the configured model, then without its provider prefix; a model
without a price there is priced by LiteLLM's table when the translator served it, else 0 (and
counted in acs_llm_unpriced_calls_total: a budget cannot bound what it cannot price).

A conversation's budget (`max_budget_per_task`), the user's monthly budget
(ACS_LLM_USER_MONTHLY_BUDGET), the organization's monthly budget and the member's there (set
through the organizations API; the call is charged to the sandbox's organization, or for a
user's own gateway key to the organization they act in) are checked against what was recorded
before the call: a call that starts under budget runs to its end, the next one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.store import keyspace, text

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
    now = now or datetime.now(UTC)
    return f"{now.year:04d}-{now.month:02d}"  # strftime("%Y-%m"), at a tenth of its cost


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
    """What a call cost. The counts come checked (gateway/answers.py: whole, non-negative,
    bounded), the prices too (config.py), `fallback` (LiteLLM's price) finite and non-negative:
    a cost is never negative, NaN or infinite, whatever a provider said."""
    price = price_of(prices, model)
    if price is not None:
        cost = prompt_tokens * price[0] + completion_tokens * price[1]
        return Usage(prompt_tokens, completion_tokens, cost, True)
    if fallback is not None:
        return Usage(prompt_tokens, completion_tokens, fallback, True)
    return Usage(prompt_tokens, completion_tokens, 0.0, False)


def spent_of(row: list[bytes | str | None]) -> Spent:
    cost, prompt, completion, requests = (text(v) if v is not None else "0" for v in row)
    return Spent(float(cost), int(prompt), int(completion), int(requests))


FIELDS = ["cost", "prompt_tokens", "completion_tokens", "requests"]


# KEYS: each record's keys in turn: the user's month, the organization's and the member's there
# (optional), then the conversation's (optional). ARGV: the months' TTL, then five for each
# record: how many keys are its, how many of them are months, cost, prompt tokens, completion
# tokens. One command: what one or several calls cost, each added everywhere at once.
_RECORD = """
local k = 1
for a = 2, #ARGV, 5 do
  local last = k + tonumber(ARGV[a]) - 1
  for i = k, last do
    redis.call('HINCRBYFLOAT', KEYS[i], 'cost', ARGV[a + 2])
    redis.call('HINCRBY', KEYS[i], 'prompt_tokens', ARGV[a + 3])
    redis.call('HINCRBY', KEYS[i], 'completion_tokens', ARGV[a + 4])
    redis.call('HINCRBY', KEYS[i], 'requests', 1)
  end
  for i = k, k + tonumber(ARGV[a + 1]) - 1 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
  k = last + 1
end
return 1
"""


RECORD_BATCH = 250
"""Records one script adds at most (each up to 4 keys of 4 increments and an expiry: ~5,000
commands, a few milliseconds of Redis): the calls settled while a write is on its way are as
many as the gateway answered meanwhile, thousands after a stall of Redis, and one script for
them all would hold Redis for every caller as long."""


@dataclass(frozen=True)
class Record:
    """What one call cost, and whose it is."""

    user_id: str
    conversation_id: str | None
    usage: Usage
    org_id: str | None = None


class Meter:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._record = redis.register_script(_RECORD)

    async def spent(self, user_id: str, conversation_id: str | None) -> tuple[Spent, Spent]:
        """(the conversation's, the user's this month) in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keyspace.llm_usage_user(user_id, month()), FIELDS)
            if conversation_id is not None:
                pipe.hmget(keyspace.llm_usage_conversation(conversation_id), FIELDS)
            rows = await pipe.execute()
        user = spent_of(rows[0])
        conversation = spent_of(rows[1]) if conversation_id is not None else Spent()
        return conversation, user

    async def record(
        self,
        user_id: str,
        conversation_id: str | None,
        usage: Usage,
        *,
        org_id: str | None = None,
    ) -> None:
        """Add `usage` to the user's month, the conversation's, and (`org_id`) the
        organization's month and the member's month there, in one script."""
        await self.record_many([Record(user_id, conversation_id, usage, org_id)])

    async def record_many(self, records: list[Record]) -> None:
        """Each record added as `record` adds it, RECORD_BATCH a script: the calls settled
        while the previous write was on its way cost one command between them (service.py).
        A script that fails leaves the next ones unsent (the exception is the caller's)."""
        this_month = month()
        for start in range(0, len(records), RECORD_BATCH):
            keys: list[str] = []
            args: list[str | int] = [USER_USAGE_TTL]
            for r in records[start : start + RECORD_BATCH]:
                targets = [keyspace.llm_usage_user(r.user_id, this_month)]
                if r.org_id is not None:
                    targets.append(keyspace.llm_usage_org(r.org_id, this_month))
                    targets.append(keyspace.llm_usage_member(r.org_id, r.user_id, this_month))
                if r.conversation_id is not None:
                    targets.append(keyspace.llm_usage_conversation(r.conversation_id))
                keys += targets
                months = 3 if r.org_id is not None else 1  # a conversation's has no TTL
                usage = r.usage
                args += [len(targets), months, repr(usage.cost), usage.prompt_tokens,
                         usage.completion_tokens]  # fmt: skip
            await self._record(keys=keys, args=args)
