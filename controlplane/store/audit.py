"""Writing the audit log: who did what, to what, when, from where, and how it ended.

An entry is written by the same atomic write as the action it records (a store's MULTI or Lua
script takes it, as it takes a lifecycle event: controlplane/store/streams.py), so an action that
happened has its entry and a kill between the two cannot separate them. What the write does not
know comes with the request: its **scope** (the caller, their address and user agent, the
request id, the action the route stands for and the ids in its path), set by the audit
middleware and carried in a context variable as the request's durable-write flag is
(store/durable.py), so that stores deep below the handlers add the request's entry to their own
write without every signature in between carrying it. Outside a request (the reaper, the
reconciler, a start task resumed after a restart) there is no scope and no entry: those are
lifecycle events. An action whose outcome is only known after the call (a refusal, a failed
sign-in, an action forwarded to a sandbox) is written once, afterwards, with its result (`record`).

Storage (names in keyspace): the request writes the entry alone, to `acs:audit` (trimmed by age,
MINID ~), in its action's own MULTI or script: as cheap as storing it at all can be. The indexes a
search reads (an organization's, an action's, a user's, a target's: `index_keys`) are built from
the log afterwards by the indexer (store/audit_index.py), which every replica runs: one script
per batch, from a watermark forward, so that each index entry is written exactly once, and a
search answers from the indexes up to the watermark and from the log past it
(controlplane/audit/search.py): it never misses an entry that was written. The sinks' outbox
streams get the entry as JSON in the same write (the deliverer of
controlplane/lifecycle/webhooks.py sends it).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

import redis.asyncio as aioredis
import structlog

from controlplane.store import keyspace
from controlplane.store.audit_event import AuditEvent, AuditRecord, Outcome
from controlplane.store.audit_flood import DROPPED_ACTION, AnonymousGate, AnonymousLimits
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.streams import APPEND_SCRIPT, LATE_ID, StreamAdd, StreamEntry

log = structlog.get_logger(__name__)


class AuditAction(StrEnum):
    """Every action the audit log records (docs/operations.md#the-audit-log)."""

    SIGN_IN = "auth.sign_in"
    SIGN_OUT = "auth.sign_out"
    SESSION_END = "auth.session_end"
    """The provider refused a signed-in user at a session check: the session ended."""
    DEVICE_DECIDE = "auth.device_decide"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    KEY_SUSPEND = "key.suspend"
    KEY_RESTORE = "key.restore"
    ORG_CREATE = "org.create"
    ORG_UPDATE = "org.update"
    ORG_SWITCH = "org.switch"
    MEMBER_SET = "member.set"
    MEMBER_REMOVE = "member.remove"
    SANDBOX_CREATE = "sandbox.create"
    SANDBOX_PAUSE = "sandbox.pause"
    SANDBOX_RESUME = "sandbox.resume"
    SANDBOX_DELETE = "sandbox.delete"
    CONVERSATION_START = "conversation.start"
    CONVERSATION_UPDATE = "conversation.update"
    CONVERSATION_DELETE = "conversation.delete"
    CONVERSATION_MESSAGE = "conversation.message"
    CONVERSATION_CONFIRM = "conversation.confirm"
    CONVERSATION_AGENT_PAUSE = "conversation.agent_pause"
    CONVERSATION_AGENT_RUN = "conversation.agent_run"
    PENDING_QUEUE = "conversation.pending_queue"
    PENDING_DELIVER = "conversation.pending_deliver"
    SANDBOX_CALL = "sandbox.call"
    """A call forwarded to the caller's sandbox's agent server (Agent Canvas's cloud proxy)."""
    TICKET_CREATE = "ticket.create"
    SETTINGS_UPDATE = "settings.update"
    PROVIDERS_UPDATE = "settings.providers_update"
    PROVIDERS_UNSET = "settings.providers_unset"
    SECRET_CREATE = "secret.create"  # noqa: S105 (an action's name)
    SECRET_UPDATE = "secret.update"  # noqa: S105 (an action's name)
    SECRET_DELETE = "secret.delete"  # noqa: S105 (an action's name)
    PROFILE_SAVE = "profile.save"
    PROFILE_DELETE = "profile.delete"
    PROFILE_RENAME = "profile.rename"
    PROFILE_ACTIVATE = "profile.activate"
    AGENT_PROFILE_CHANGE = "agent_profile.change"
    GATEWAY_KEY_REFRESH = "gateway_key.refresh"
    GATEWAY_KEY_REVOKE = "gateway_key.revoke"
    SNAPSHOT_CREATE = "snapshot.create"
    SNAPSHOT_DELETE = "snapshot.delete"
    SANDBOX_FORK = "sandbox.fork"
    CONVERSATION_REWIND = "conversation.rewind"
    CONVERSATION_FORK = "conversation.fork"
    ANONYMOUS_DROPPED = DROPPED_ACTION
    """The summary of a window's anonymous failures left out of the log (audit_flood.py)."""


@dataclass(frozen=True)
class Actor:
    """Who acted: `via` api_key, session, oidc, single_user, ticket, device, cli or system (the
    control plane itself, on what the provider said)."""

    user_id: str | None = None
    key_id: str | None = None
    via: str = "system"
    admin: bool = False
    org_id: str | None = None
    role: str | None = None


SYSTEM = Actor()
ANONYMOUS_DEFAULTS = AnonymousLimits(per_source=10, per_window=100, window=60.0)

# Shapes of the secrets this service hands out or accepts, and of common bearer tokens: a value
# a client put where an id or a user agent goes is replaced before it is stored.
_SECRET_SHAPES = re.compile(
    r"acs_[0-9a-f]{12}_[A-Za-z0-9_-]+|acs-llm\.\S+|acsgw\.\S+|wst_[A-Za-z0-9_-]+"
    r"|eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*|gAAAAA[A-Za-z0-9_=-]+"
    r"|sk-[A-Za-z0-9_-]{16,}|(?i:bearer|basic)\s+\S+"
)
# In free text (a user agent, a request id): any long run of token characters (random tokens of
# 32 bytes are 43 of them; a UUID is 36, a browser's longest word about 20).
_LONG_RUN = re.compile(r"[A-Za-z0-9_\-+/=.~]{40,}")
REDACTED = "[redacted]"
AGENT_MAX = 256
_AGENTS_MAX = 1_000
"""User agents whose redacted form a writer remembers: few clients send most requests."""


class AuditLog:
    """The audit log's writer, made once by the wiring (and by the CLI): where entries go, how
    long they are kept, and which exact values (the deployment's own secrets) never go in."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        retention: float,
        sink_streams: Iterable[str] = (),
        secrets_: Iterable[str | None] = (),
        anonymous: AnonymousLimits | None = None,
    ) -> None:
        """`retention`: seconds entries are kept; `sink_streams`: the outbox stream of each
        sink (each gets every entry as JSON); `secrets_`: values to redact wherever they
        appear (the bootstrap key, the client secret, webhook secrets); `anonymous`: the bounds
        of anonymous failures (controlplane/store/audit_flood.py; None: the defaults)."""
        self.redis = redis
        self.retention_ms = int(retention * 1000)
        self.sink_streams = tuple(sink_streams)
        self._exact = tuple(s for s in secrets_ if s and len(s) >= 8)
        self.anonymous = AnonymousGate(redis, anonymous or ANONYMOUS_DEFAULTS, self.adds)
        self._agents: dict[str, str] = {}

    def redact(self, value: str, *, free: bool = False) -> str:
        """`value` with every secret-shaped part replaced (`free`: text a client chose, where
        any long token counts)."""
        for secret in self._exact:
            value = value.replace(secret, REDACTED)
        value = _SECRET_SHAPES.sub(REDACTED, value)
        return _LONG_RUN.sub(REDACTED, value) if free else value

    def agent(self, user_agent: str) -> str:
        """A client's user agent as an entry keeps it: cut, valid UTF-8, redacted (remembered:
        the same few agents send most requests, and redaction is regular expressions)."""
        kept = self._agents.get(user_agent)
        if kept is None:
            if len(self._agents) >= _AGENTS_MAX:
                self._agents.clear()
            kept = self.redact(_utf8(user_agent[:AGENT_MAX]), free=True)
            self._agents[user_agent] = kept
        return kept

    def entry(self, record: AuditRecord) -> StreamEntry:
        """The entry that stores `record` (for its action's write to carry)."""
        return StreamEntry((self.adds(record),))

    def adds(self, record: AuditRecord) -> tuple[StreamAdd, ...]:
        """The additions that store `record`: the entry in the log (trimmed by age, never
        expired: it is written to all the time) and, as JSON, in each sink's outbox. No index:
        the indexer builds them from the log (store/audit_index.py)."""
        adds = [
            StreamAdd(keyspace.AUDIT, record.fields(), minid=record.time_ms - self.retention_ms)
        ]
        if self.sink_streams:
            line = AuditEvent.of(record).line()
            if LATE_ID in record.targets.values():
                line = line.replace('"\\u0000"', f'"{LATE_ID}"')  # for the script to fill in
            adds += [StreamAdd(key, ("e", line)) for key in self.sink_streams]
        return tuple(adds)

    async def write(self, entry: StreamEntry) -> None:
        """Store `entry` on its own (one script). Raises what Redis raises."""
        keys, args = entry.script_args()
        await self.redis.eval(APPEND_SCRIPT, len(keys), *keys, *args)
        entry.stored()


def index_keys(record: AuditRecord) -> tuple[list[str], list[str]]:
    """The indexes `record` belongs in, all holding its stream id: streams (its organization's,
    its action's, the organization's per action, its user's and the organization's per user)
    and sorted sets (each target id's, deployment-wide and the organization's; most targets have
    a few entries, where a stream would cost 4 kB). The indexer writes them
    (store/audit_index.py)."""
    org = record.org_id or keyspace.AUDIT_NO_ORG
    streams = [
        keyspace.audit_org(org),
        keyspace.audit_org_action(org, record.action),
        keyspace.audit_action(record.action),
    ]
    org_user, org_targets = org_index_keys(record)
    if record.user_id and org_user:
        streams += (keyspace.audit_user(record.user_id), org_user)
    sorted_sets = [
        key
        for target, org_target in org_targets.items()
        for key in (keyspace.audit_target(target), org_target)
    ]
    return streams, sorted_sets


def org_index_keys(record: AuditRecord) -> tuple[str | None, dict[str, str]]:
    """The per-organization indexes of `record`: its user's stream (None without a user) and,
    by target id, its targets' sorted sets. The indexer writes them (index_keys);
    store/audit_backfill.py fills them for entries older than them."""
    org = record.org_id or keyspace.AUDIT_NO_ORG
    user = keyspace.audit_org_user(org, record.user_id) if record.user_id else None
    targets = indexed_targets(record.targets)
    return user, {target: keyspace.audit_org_target(org, target) for target in targets}


def indexed_targets(targets: dict[str, str]) -> list[str]:
    """The target ids with an index of their own: ids, not names such as a secret's, and not an
    organization's (its own index has its entries)."""
    return sorted({v for k, v in targets.items() if k.endswith("_id") and k != "org_id" and v})


@dataclass
class Scope:
    """The request an entry belongs to (or the CLI's command)."""

    log: AuditLog
    actor: Callable[[], Actor | None]
    """Read when an entry is made: authentication runs inside the audit middleware."""
    ip: str | None = None
    user_agent: str | None = None
    request_id: str | None = None
    action: AuditAction | None = None
    """The action of the request's route (controlplane/audit/actions.py), if it has one."""
    targets: dict[str, str] = field(default_factory=dict)
    """The ids in the route's path (and query) the action is done to."""
    details: dict[str, str] = field(default_factory=dict)
    recorded: set[tuple[str, str]] = field(default_factory=set)
    """(action, targets) of the entries stored for this request: each once."""

    def has_recorded(self, action: str) -> bool:
        return any(a == action for a, _ in self.recorded)


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("acs_audit", default=None)


@contextlib.contextmanager
def acting(scope: Scope) -> Iterator[Scope]:
    """Entries made inside (and in tasks started inside) belong to `scope`."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def current() -> Scope | None:
    return _SCOPE.get()


def note(**details: str | None) -> None:
    """Add named details to the request's own entry (a new role, the fields changed). Values are
    names, never what a field holds."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.details.update({k: v for k, v in details.items() if v is not None})


def entry(
    action: AuditAction | None = None,
    *,
    actor: Actor | None = None,
    org: str | None = None,
    outcome: Outcome = "success",
    status: int | None = None,
    reason: str | None = None,
    details: dict[str, str] | None = None,
    **targets: str | None,
) -> StreamEntry | None:
    """The request's entry for a store write to add (None outside a request, for an action it
    made already, or with no action: a route without one). `action` defaults to the route's,
    whose path ids and noted details it then carries; `targets` add to them (LATE_ID for an id
    the script chooses). The organization is `org`, else the target `org_id`, else the
    caller's."""
    return _entry(
        action,
        actor=actor,
        org=org,
        outcome=outcome,
        status=status,
        reason=reason,
        details=details,
        targets=targets,
    )


def _entry(
    action: AuditAction | None,
    *,
    actor: Actor | None,
    org: str | None,
    outcome: Outcome,
    status: int | None,
    reason: str | None,
    details: dict[str, str] | None,
    targets: dict[str, str | None],
) -> StreamEntry | None:
    scope = _SCOPE.get()
    if scope is None:
        return None
    own = action is None or action == scope.action
    action = action or scope.action
    if action is None:
        return None
    named = {k: v for k, v in targets.items() if v}
    if own:
        named = scope.targets | named
    done = (action.value, "&".join(f"{k}={v}" for k, v in sorted(named.items())))
    if done in scope.recorded:
        return None
    record = _record(
        scope,
        action=action,
        actor=actor,
        org=org,
        outcome=outcome,
        status=status,
        reason=reason,
        targets=named,
        details=details,
        own=own,
    )
    made = scope.log.entry(record)
    return StreamEntry(made.groups, on_stored=(*made.on_stored, lambda: scope.recorded.add(done)))


async def record(
    action: AuditAction | None = None,
    *,
    actor: Actor | None = None,
    org: str | None = None,
    outcome: Outcome = "success",
    status: int | None = None,
    reason: str | None = None,
    details: dict[str, str] | None = None,
    **targets: str | None,
) -> None:
    """Write the request's entry on its own, once the outcome is known (a refusal, a failed
    sign-in, an action done elsewhere). Never raises: Redis down leaves a log line."""
    made = entry(
        action,
        actor=actor,
        org=org,
        outcome=outcome,
        status=status,
        reason=reason,
        details=details,
        **targets,
    )
    scope = _SCOPE.get()
    if made is None or scope is None:
        return
    who = actor or scope.actor()
    try:
        if outcome == "failure" and (who is None or who.user_id is None):
            # Nobody known sent it: bounded per source and per window (audit_flood.py).
            await scope.log.anonymous.write(made, scope.ip)
        else:
            await scope.log.write(made)
    except REDIS_DOWN as exc:
        log.warning("audit_not_stored", action=str(action or scope.action), error=str(exc))


def _utf8(value: str) -> str:
    """`value` with what UTF-8 cannot hold replaced (U+FFFD): aiohttp keeps a header's bytes
    that are not UTF-8 as lone surrogates, which Redis's client refuses to encode, and a user
    agent such as `caf\\xe9` would otherwise fail the action its entry is written with."""
    try:
        raw = value.encode("utf-8", "surrogateescape")  # the client's bytes, as they came
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogatepass")  # a surrogate no byte stands for
    return raw.decode("utf-8", "replace")


def new_id(now_ms: int) -> str:
    """Time-ordered and unique: 12 hex digits of milliseconds, 8 random."""
    return f"{now_ms:012x}{secrets.token_hex(4)}"


def _record(
    scope: Scope,
    *,
    action: AuditAction,
    actor: Actor | None,
    org: str | None,
    outcome: Outcome,
    status: int | None,
    reason: str | None,
    targets: dict[str, str],
    details: dict[str, str] | None,
    own: bool,
) -> AuditRecord:
    redact = scope.log.redact
    who = actor or scope.actor() or SYSTEM
    named = {k: redact(v) for k, v in targets.items()}
    noted = (scope.details if own else {}) | (details or {})
    now_ms = int(time.time() * 1000)
    agent = scope.log.agent(scope.user_agent) if scope.user_agent else None
    return AuditRecord(
        id=new_id(now_ms),
        time_ms=now_ms,
        action=action.value,
        outcome=outcome,
        user_id=who.user_id,
        key_id=who.key_id,
        via=who.via,
        admin=who.admin,
        # A refusal is in the caller's organization's log: a path may name any organization.
        org_id=org or (named.get("org_id") if outcome == "success" else None) or who.org_id,
        role=who.role,
        status=status,
        reason=reason,
        targets=named,
        ip=scope.ip,
        user_agent=agent,
        request_id=redact(scope.request_id, free=True) if scope.request_id else None,
        details={k: redact(v) for k, v in noted.items()},
    )


@contextlib.contextmanager
def as_actor(actor: Actor) -> Iterator[None]:
    """Entries made inside name `actor` as who acted (a public route whose caller is known only
    to its service: the device whose user approved it). Nothing outside a request."""
    scope = _SCOPE.get()
    if scope is None:
        yield
        return
    token = _SCOPE.set(replace(scope, actor=lambda: actor))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def route_entry(*actions: AuditAction, **targets: str | None) -> StreamEntry | None:
    """The request's own entry (as `entry()`), if its route is one of `actions`: for a store
    whose write is one of those actions when a route asks for it, and bookkeeping otherwise."""
    scope = _SCOPE.get()
    if scope is None or scope.action not in actions:
        return None
    return _entry(
        None,
        actor=None,
        org=None,
        outcome="success",
        status=None,
        reason=None,
        details=None,
        targets=targets,
    )
