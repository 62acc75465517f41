"""The gateway's decisions for one call: who calls (credentials.py), for which model and
provider (upstream.py), within which limits (metering.py and the per-user rate limit), then
what it cost."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.api.ratelimit import Decision, RateLimiter
from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.crypto import SecretBox
from controlplane.errors import NotFound
from controlplane.gateway.agent_llm import PATH
from controlplane.gateway.answers import Metered
from controlplane.gateway.calls import AdmittedCall, BodyReader, Call
from controlplane.gateway.credentials import (
    MAX_CREDENTIAL,
    SANDBOX_FIELDS,
    USER_KEY_FIELDS,
    Caller,
    InvalidCredential,
    SandboxClaim,
    SandboxTokens,
    UserGatewayKeys,
    UserKeyClaim,
    check_scope,
    looks_like_sandbox_token,
    looks_like_user_key,
)
from controlplane.gateway.forward import Forwarder, GatewayError, estimate_prompt
from controlplane.gateway.metering import FIELDS as USAGE_FIELDS
from controlplane.gateway.metering import (
    Meter,
    Record,
    Spent,
    Usage,
    cost_of,
    month,
    price_of,
    spent_of,
)
from controlplane.gateway.metrics import GatewayMetrics
from controlplane.gateway.reads import Reads, ReadsScript
from controlplane.gateway.upstream import UpstreamError, matches, resolve
from controlplane.organizations.models import MemberLlmUsage, OrgLlmUsage
from controlplane.settings.models import UserRecord
from controlplane.store import keyspace, text
from controlplane.store.durable import bookkeeping

log = structlog.get_logger(__name__)


ORG = "\x00"
"""Stands for the organization in the keys the reads script completes (Reads.org)."""
RECORD_CACHE = 1000
"""Parsed settings kept, by ciphertext (oldest out first)."""


@dataclass
class Loaded:
    """What one round trip to Redis read for a call."""

    caller: Caller
    record: UserRecord
    user_spent: Spent = field(default_factory=Spent)
    conversation_spent: Spent = field(default_factory=Spent)
    decision: Decision | None = None
    org: OrgSpend | None = None
    """The organization the call is charged to (None: the user is in none)."""


LOST_USERS_SHOWN = 20
"""Users (by the cost lost) a failed usage write names in its log line."""


@dataclass
class _Batch:
    """Calls' usage written to Redis in one command, and when that is done (written or
    given up on: `recorded` waits for it either way)."""

    records: list[Record]
    done: asyncio.Future[None]


@dataclass(frozen=True)
class OrgSpend:
    org_id: str
    budget: float | None
    """The organization's own monthly budget."""
    member_budget: float | None
    """The member's there: their own, else the organization's for each member."""
    spent: Spent
    member_spent: Spent

    @classmethod
    def of(cls, reply: Any) -> OrgSpend | None:
        if not reply:
            return None
        org, budget, each, own, spent, member_spent = reply
        member = own if own is not None else each
        return cls(
            text(org),
            float(text(budget)) if budget is not None else None,
            float(text(member)) if member is not None else None,
            spent_of(spent),
            spent_of(member_spent),
        )


@dataclass(frozen=True)
class Configured:
    """What a credential may call (GET /v1/models, /v1/model/info)."""

    caller: Caller
    model: str | None
    price: tuple[float, float] | None
    """(input, output) per token, from ACS_LLM_PRICES; None: not priced there."""


@dataclass(frozen=True)
class MonthUsage:
    month: str
    spent: Spent
    budget: float | None
    """ACS_LLM_USER_MONTHLY_BUDGET; None: none."""


class GatewayService:
    def __init__(
        self,
        config: ServiceConfig,
        redis: aioredis.Redis,
        box: SecretBox,
        *,
        tokens: SandboxTokens,
        user_keys: UserGatewayKeys,
        forwarder: Forwarder,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self._redis = redis
        self._box = box
        self._open: _Batch | None = None  # records settled, not yet sent
        self._writing: _Batch | None = None  # the records on their way to Redis
        self._flusher: asyncio.Task[None] | None = None
        self._records: dict[str, UserRecord] = {}
        self.tokens = tokens
        self._user_keys = user_keys
        self._forwarder = forwarder
        self.metrics = metrics
        self._meter = Meter(redis)
        self._reads = ReadsScript(redis)
        per_minute = config.llm_rate_limit_per_minute
        self._limiter = RateLimiter(redis, per_minute) if per_minute else None

    # --- who is calling, and within which limits: one Redis round trip ----------------

    def _claim(self, presented: str | None) -> SandboxClaim | UserKeyClaim:
        """What a credential claims, if it can be genuine (no Redis needed). Raises 401."""
        if not presented or len(presented) > MAX_CREDENTIAL:
            raise GatewayError(401, "invalid_api_key", "missing or malformed gateway credential")
        claim: SandboxClaim | UserKeyClaim | None = None
        if looks_like_sandbox_token(presented):
            claim = self.tokens.parse(presented)
        elif looks_like_user_key(presented):
            claim = self._user_keys.parse(presented)
        if claim is None:
            raise GatewayError(401, "invalid_api_key", "not a valid LLM gateway credential")
        return claim

    def _queue(self, reads: Reads, claim: SandboxClaim | UserKeyClaim, metering: bool) -> None:
        """The reads of one call, in the order _load takes their replies."""
        if isinstance(claim, SandboxClaim):
            reads.get(keyspace.conversation(claim.conversation_id))
            reads.hmget(keyspace.sandbox(claim.sandbox_id), SANDBOX_FIELDS)
        else:
            reads.hmget(keyspace.llm_gateway_key(claim.key_id), USER_KEY_FIELDS)
        reads.get(keyspace.user_settings(claim.user_id))
        if metering:
            this_month = month()
            reads.hmget(keyspace.llm_usage_user(claim.user_id, this_month), USAGE_FIELDS)
            if isinstance(claim, SandboxClaim):
                reads.hmget(keyspace.llm_usage_conversation(claim.conversation_id), USAGE_FIELDS)
            reads.org(
                keyspace.sandbox(claim.sandbox_id)
                if isinstance(claim, SandboxClaim)
                else keyspace.user_orgs(claim.user_id),
                "org" if isinstance(claim, SandboxClaim) else "~current",
                self._config.default_organization,
                (
                    keyspace.organization(ORG),
                    keyspace.llm_usage_org(ORG, this_month),
                    keyspace.org_member_limits(ORG, claim.user_id),
                    keyspace.llm_usage_member(ORG, claim.user_id, this_month),
                ),
                USAGE_FIELDS,
            )
            if self._limiter is not None:
                reads.hit(keyspace.rate_limit(f"llm:{claim.user_id}"))

    @staticmethod
    def _caller(claim: SandboxClaim | UserKeyClaim, rows: list[Any]) -> Caller:
        """Checks the claim against the records it was read with (taking their replies)."""
        try:
            if isinstance(claim, SandboxClaim):
                raw = rows.pop(0)
                model = check_scope(claim, json.loads(raw) if raw else None, rows.pop(0))
                return Caller(
                    user_id=claim.user_id,
                    conversation_id=claim.conversation_id,
                    sandbox_id=claim.sandbox_id,
                    model=model,
                )
            UserGatewayKeys.check(claim, rows.pop(0))
            return Caller(user_id=claim.user_id, key_id=claim.key_id)
        except InvalidCredential as exc:
            raise GatewayError(401, "invalid_api_key", str(exc)) from None

    async def _load(self, claim: SandboxClaim | UserKeyClaim, *, metering: bool) -> Loaded:
        """The caller of a credential's claim, checked against Redis now, with the user's
        settings and (`metering`) what they spent and their rate-limit count: one round trip.
        Raises GatewayError 401."""
        reads = Reads()
        self._queue(reads, claim, metering)
        with bookkeeping():  # only the rate count writes: no wait for a replica on every call
            rows = await self._reads.run(reads)
        caller = self._caller(claim, rows)
        record = self._record_of(rows.pop(0))
        loaded = Loaded(caller, record)
        if metering:
            loaded.user_spent = spent_of(rows.pop(0))
            if caller.conversation_id is not None:
                loaded.conversation_spent = spent_of(rows.pop(0))
            loaded.org = OrgSpend.of(rows.pop(0))
            if loaded.org is not None:
                loaded.caller = replace(caller, org_id=loaded.org.org_id)
            if self._limiter is not None:
                loaded.decision = self._limiter.decision(rows.pop(0))
        return loaded

    def _record_of(self, raw: bytes | str | None) -> UserRecord:
        """The user's settings from their encrypted record, decrypted and parsed once per
        version of it: the cache is keyed by the ciphertext, so a change is never missed."""
        if raw is None:
            return UserRecord()
        token = text(raw)
        record = self._records.get(token)
        if record is None:
            record = UserRecord.model_validate_json(self._box.decrypt(token.encode()))
            if len(self._records) >= RECORD_CACHE:
                self._records.pop(next(iter(self._records)))
            self._records[token] = record
        return record

    async def configured_model(self, presented: str | None) -> Configured:
        """The caller, the model its credential may call and that model's price."""
        loaded = await self._load(self._claim(presented), metering=False)
        model = loaded.caller.model or loaded.record.settings.llm_model
        price = price_of(self._config.llm_prices, model) if model else None
        return Configured(loaded.caller, model, price)

    # --- before forwarding ------------------------------------------------------------

    async def call(self, presented: str | None, read_body: BodyReader) -> AdmittedCall:
        """One chat completion, admitted (its answer is the handler's to ask for). What cannot
        be a credential (malformed, or a sandbox token whose signature does not hold: no Redis
        needed) is refused before a byte of the body is read (at most
        ACS_LLM_GATEWAY_MAX_BODY_BYTES); then `_admit`. Raises GatewayError."""
        claim = self._claim(presented)  # once: its signature is checked here only
        body, raw = await read_body(self._config.llm_gateway_max_body_bytes)
        await self.recorded()
        call = await self._admit(claim, body.get("model"))
        return AdmittedCall(call, body, raw, self._forwarder, self.settle)

    async def _admit(self, claim: SandboxClaim | UserKeyClaim, requested: Any) -> Call:
        """Credential, model, provider, rate limit and budgets for one call. Raises
        GatewayError."""
        loaded = await self._load(claim, metering=True)
        caller, record = loaded.caller, loaded.record
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
        self._check_limits(loaded, record.settings.max_budget_per_task)
        return Call(caller, model, upstream, time.perf_counter())

    def _check_limits(self, loaded: Loaded, settings_budget: float | None) -> None:
        caller, decision = loaded.caller, loaded.decision
        budget_task = settings_budget if caller.conversation_id is not None else None
        budget_user = self._config.llm_user_monthly_budget
        conversation, user = loaded.conversation_spent, loaded.user_spent
        if decision is not None and not decision.allowed:
            self.metrics.refused.labels(reason="rate_limit").inc()
            raise GatewayError(
                429,
                "rate_limit_exceeded",
                f"rate limit of {decision.limit} LLM calls per minute for this user reached",
                retry_after=decision.reset_after,
            )
        org = loaded.org
        # (spent, budget, the metric's reason, what the refusal says): the first reached refuses.
        budgets = [
            (conversation.cost, budget_task, "task_budget", "this conversation's LLM cost {} "
             "reached its budget of {} (max_budget_per_task)"),
            (user.cost, budget_user, "user_budget", "the user's LLM cost this month {} reached "
             "the monthly budget of {}"),
        ]  # fmt: skip
        if org is not None:
            budgets += [
                (org.spent.cost, org.budget, "org_budget", f"organization {org.org_id}'s LLM "
                 "cost this month {} reached its monthly budget of {}"),
                (org.member_spent.cost, org.member_budget, "member_budget", "the user's LLM "
                 f"cost this month in organization {org.org_id} {{}} reached their budget "
                 "there of {}"),
            ]  # fmt: skip
        for spent, budget, reason, message in budgets:
            if budget is not None and spent >= budget:
                self.metrics.refused.labels(reason=reason).inc()
                raise GatewayError(
                    400,
                    "budget_exceeded",
                    "BudgetExceeded: " + message.format(f"${spent:.6f}", f"${budget:.6f}"),
                )

    # --- after ------------------------------------------------------------------------

    def _queue_record(self, record: Record) -> None:
        """Sent soon and not waited for: the answer goes out meanwhile. The records settled
        while a write is on its way go together in the next one (one command for all of them:
        under concurrency, most calls' usage costs a fraction of a round trip)."""
        if self._open is None:
            self._open = _Batch([], asyncio.get_running_loop().create_future())
        self._open.records.append(record)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        """Write the open batch, then the one that opened meanwhile, until none is left."""
        try:
            while self._open is not None:
                batch, self._open = self._open, None
                self._writing = batch
                try:
                    # Not waited for by the caller, nor for a replica: a replica down would
                    # otherwise hold a connection per call for the whole WAIT time-out
                    # (ACS_REDIS_WAIT_TIMEOUT).
                    with bookkeeping():
                        await self._meter.record_many(batch.records)
                except Exception:
                    # One line a batch, not one a call: a batch after a Redis stall holds
                    # thousands of calls, and a traceback each would flood the log.
                    lost: dict[str, float] = {}
                    for r in batch.records:
                        lost[r.user_id] = lost.get(r.user_id, 0.0) + r.usage.cost
                    shown = dict(sorted(lost.items(), key=lambda kv: -kv[1])[:LOST_USERS_SHOWN])
                    log.exception(
                        "llm_usage_not_recorded",
                        calls=len(batch.records),
                        users=len(lost),
                        cost=sum(lost.values()),
                        cost_by_user=shown,
                    )
                finally:
                    self._writing = None
                    batch.done.set_result(None)
        finally:
            self._flusher = None
            left, self._open = self._open, None
            if left is not None:  # cancelled (the loop's end): nothing waits for them in vain
                log.error("llm_usage_not_recorded", calls=len(left.records))
                left.done.set_result(None)

    async def recorded(self) -> None:
        """Wait for usage still being written (the calls answered so far are then in Redis).
        Before budgets or usage are read: without it a write still on its way (its script's
        first run after a Redis start takes three round trips; a loaded host delays it) let a
        caller's next call, or an org member's, start over the budget. Usually none is in
        flight; one is a Redis round trip, two at most (the write under way, then the one
        with the records settled since): never the writes of calls settled after this."""
        waits = [b.done for b in (self._writing, self._open) if b is not None]
        if waits:
            # asyncio.wait: a caller cancelled meanwhile cancels nothing of the writes.
            await asyncio.wait(waits)

    async def close(self) -> None:
        await self.recorded()

    def settle(self, call: Call, body: dict[str, Any], metered: Metered, status: int) -> Usage:
        """Record what the call cost (what the provider reported, else an estimate) and
        observe it."""
        provider = call.upstream.provider
        prompt, completion = metered.prompt_tokens, metered.completion_tokens
        if not metered.reported and (status < 400 or status == 499):
            prompt = estimate_prompt(body)
            completion = metered.streamed_chars // 4
            self.metrics.estimated.labels(provider=provider).inc()
        usage = cost_of(self._config.llm_prices, call.model, prompt, completion, metered.cost)
        # A stream the client left (499) was still paid for, as far as it went.
        billable = status < 400 or (status == 499 and (metered.reported or metered.streamed_chars))
        if billable:
            # The next call on this replica waits for it before its budgets are read (`call`).
            caller = call.caller
            self._queue_record(Record(caller.user_id, caller.conversation_id, usage, caller.org_id))
            if not usage.priced:
                self.metrics.unpriced.labels(provider=provider).inc()
        self.metrics.observe(
            provider=provider,
            status=status,
            seconds=time.perf_counter() - call.started,
            usage=usage,
            errors=metered.errors,
        )
        # On the request's own log line (the context middleware writes it), not one more line.
        structlog.contextvars.bind_contextvars(
            llm_caller=call.caller.label,
            llm_conversation_id=call.caller.conversation_id,
            llm_provider=provider,
            llm_via=call.upstream.via,
            llm_attempts=metered.attempts,
            llm_prompt_tokens=usage.prompt_tokens,
            llm_completion_tokens=usage.completion_tokens,
            llm_cost=round(usage.cost, 8),
        )
        return usage

    async def conversation_usage(self, principal: Principal, conversation_id: str) -> Spent:
        """What the gateway metered for one conversation of the caller's (any, for an admin).
        Raises NotFound for one that does not exist or is someone else's."""
        await self.recorded()
        owner = await self.conversation_owner(conversation_id)
        if owner is None or (owner != principal.user_id and not principal.is_admin):
            raise NotFound(f"no conversation {conversation_id}")
        spent, _ = await self._meter.spent(principal.user_id, conversation_id)
        return spent

    async def month_usage(self, user_id: str) -> MonthUsage:
        """What the gateway metered for the user this month, and their budget."""
        await self.recorded()
        _, spent = await self._meter.spent(user_id, None)
        return MonthUsage(month(), spent, self._config.llm_user_monthly_budget)

    async def org_usage(
        self, org_id: str, members: list[str], budget: float | None, each: float | None
    ) -> OrgLlmUsage:
        """What the gateway metered for `org_id` this month, in all and for each of `members`
        (with their budget there: their own, else `each`)."""
        await self.recorded()
        this_month = month()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keyspace.llm_usage_org(org_id, this_month), USAGE_FIELDS)
            for user_id in members:
                pipe.hmget(keyspace.llm_usage_member(org_id, user_id, this_month), USAGE_FIELDS)
                pipe.hget(keyspace.org_member_limits(org_id, user_id), "llm_monthly_budget")
            rows = await pipe.execute()
        total = spent_of(rows[0])
        items = []
        for n, user_id in enumerate(members):
            spent, own = spent_of(rows[1 + 2 * n]), rows[2 + 2 * n]
            items.append(
                MemberLlmUsage(
                    user_id=user_id,
                    monthly_budget=float(text(own)) if own is not None else each,
                    **asdict(spent),
                )
            )
        return OrgLlmUsage(
            org_id=org_id,
            month=this_month,
            monthly_budget=budget,
            members=items,
            **asdict(total),
        )

    async def conversation_owner(self, conversation_id: str) -> str | None:
        """The user a conversation that exists belongs to, read from its record as a sandbox
        token's check reads it (the gateway sits below the conversations' own code)."""
        raw = await self._redis.get(keyspace.conversation(conversation_id))
        owner = json.loads(raw).get("created_by_user_id") if raw else None
        return owner if isinstance(owner, str) else None

    async def tools_view(self, user_id: str, model: str | None, api_base: str) -> dict[str, Any]:
        """The LLM as the user's own tools must call it (`users/me?expose_secrets=true`): the
        model as LiteLLM names it to call the gateway (`litellm_proxy/<model>`), the gateway's
        URL under `api_base` (how the caller reached the API) and the user's gateway key; never
        the provider key. Without a model, no key either."""
        if not model:
            return {"llm_api_key": None}
        return {
            "llm_model": f"litellm_proxy/{model}",
            "llm_base_url": api_base.rstrip("/") + PATH,
            "llm_api_key": await self.user_key(user_id),
        }

    async def user_key(self, user_id: str) -> str:
        """The user's gateway key, made on first use."""
        return await self._user_keys.get_or_create(user_id)

    async def rotate_key(self, user_id: str) -> str:
        """A new gateway key for the user; the previous one stops working at once."""
        return await self._user_keys.rotate(user_id)

    async def revoke_key(self, user_id: str) -> bool:
        """The user's gateway key revoked at once; False: they had none."""
        return await self._user_keys.revoke(user_id)

    def end_streams(self) -> None:
        """At shutdown: every stream being relayed ends now with an error event (forward.py)."""
        self._forwarder.shutdown()
