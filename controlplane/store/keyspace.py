"""Every Redis key name the control plane uses, in one place: the domains' store modules (and a
few readers such as the metrics gauges) build their keys with these functions and never spell a
key out themselves.

No key has a TTL unless stated: records live until deleted, because Redis is the system of
record for ownership and intent. Sorted sets of ids are lexically ordered (every member scores 0;
ids are time-ordered) unless stated, so that a cursor is the last id seen.
"""

from __future__ import annotations

PREFIX = "acs"


def api_key(key_id: str) -> str:
    """Hash: user, admin flag, sha256 of the key, created_at."""
    return f"{PREFIX}:apikey:{key_id}"


API_KEYS = f"{PREFIX}:apikeys"
"""Sorted set of key ids scored by creation time (Unix seconds), so listing never scans."""


def user_settings(user_id: str) -> str:
    """Fernet-encrypted JSON: settings, MCP config, provider tokens, custom secrets."""
    return f"{PREFIX}:user:{user_id}:settings"


def sandbox(sandbox_id: str) -> str:
    """Hash: the sandbox record (see sandboxes.store)."""
    return f"{PREFIX}:sandbox:{sandbox_id}"


def user_sandboxes(user_id: str) -> str:
    """Lexically ordered sorted set of the user's sandbox ids (time-ordered: creation order)."""
    return f"{PREFIX}:user:{user_id}:sandboxes"


ALL_SANDBOXES = f"{PREFIX}:sandboxes"
"""Lexically ordered sorted set of every sandbox id: admin listing and the sweep."""


def sandboxes_in_status(status: str) -> str:
    """Set of the ids of every sandbox in ALL_SANDBOXES whose status is `status` (the /metrics
    gauge's counts, kept by the store's scripts with each change; never a pool member)."""
    return f"{PREFIX}:sandboxes:status:{status}"


def sandbox_by_key(key_hash: str) -> str:
    """String: sandbox id for the sha256 of its session API key (webhook authentication)."""
    return f"{PREFIX}:sandbox_key:{key_hash}"


def user_active_sandboxes(user_id: str) -> str:
    """Set of the user's STARTING/RUNNING sandbox ids: what the running cap counts."""
    return f"{PREFIX}:user:{user_id}:active_sandboxes"


def sandbox_tombstone(sandbox_id: str) -> str:
    """Marks a deleted id for store.TOMBSTONE_TTL seconds (see there why)."""
    return f"{PREFIX}:sandbox_deleted:{sandbox_id}"


def conversation(conversation_id: str) -> str:
    """String: AppConversationInfo JSON."""
    return f"{PREFIX}:conv:{conversation_id}"


CONVERSATIONS_IN_STATUS = f"{PREFIX}:convs:status:"
"""Prefix of conversations_in_status's keys (for the scripts that build them from a record)."""


def conversations_in_status(status: str | None) -> str:
    """Set of the ids of every conversation whose record's `execution_status` is `status` (None:
    none reported yet): the /metrics gauge's counts, kept with each write of the record
    (conversations/store.py `count_by_execution_status`)."""
    return CONVERSATIONS_IN_STATUS + (status or "-")


def conversation_owner(conversation_id: str) -> str:
    """String: the user a conversation id belongs to, from the first request that named or made
    it. Kept after the conversation is deleted, so an id is never handed to another user."""
    return f"{PREFIX}:conv_owner:{conversation_id}"


def user_conversations(user_id: str) -> str:
    """Lexically ordered sorted set of the user's conversation ids (uuid7: creation order)."""
    return f"{PREFIX}:user:{user_id}:convs"


USER_CONVERSATIONS_BY_UPDATE = (f"{PREFIX}:user:", ":convs:updated")
"""Prefix and suffix of user_conversations_by_update's keys (for the script that builds them)."""


def user_conversations_by_update(user_id: str) -> str:
    """Sorted set of the user's conversation ids scored by their record's `updated_at` (integer
    microseconds since the epoch): the updated-at orders' pages (conversations/store.py
    `page_by_update`), kept with each write of the record."""
    return USER_CONVERSATIONS_BY_UPDATE[0] + user_id + USER_CONVERSATIONS_BY_UPDATE[1]


def user_conversations_by_title(user_id: str) -> str:
    """Sorted set of the user's conversations, every score 0, each member the conversation's
    lowercased title (its first characters), NUL, its id: the title orders' pages in lexical
    order (conversations/store.py `page_by_title`), kept with each write of the record."""
    return f"{PREFIX}:user:{user_id}:convs:title"


USER_CONVERSATIONS_BY_CREATION = (f"{PREFIX}:user:", ":convs:created")
"""Prefix and suffix of user_conversations_by_creation's keys (for the script that builds them)."""


def user_conversations_by_creation(user_id: str) -> str:
    """Sorted set of the user's conversation ids scored by their record's `created_at` (integer
    microseconds since the epoch): a count from a creation time (one ZCOUNT) and the created-at
    orders' pages within creation bounds (conversations/store.py `page_by_creation`); client-
    chosen ids say nothing of it. Kept with each write of the record."""
    return USER_CONVERSATIONS_BY_CREATION[0] + user_id + USER_CONVERSATIONS_BY_CREATION[1]


def user_conversation_titles(user_id: str) -> str:
    """Hash: conversation id -> its title as the user's trigram index holds it (lowercased, at
    most conversations/indexes.py TRIGRAM_CHARS characters; '' for none). The buckets a
    conversation's next write takes out are this title's, whatever copy of the record the
    writer held; a title query drops the candidates whose title here lacks the query; its size
    against the user's index says the trigram index is in step. (The index of the buckets: a
    key of its own, not `user_conversation_titles_v1`'s, which older replicas still write
    during an upgrade.)"""
    return f"{PREFIX}:user:{user_id}:convs:trb_titles"


def user_title_buckets(user_id: str) -> str:
    """Prefix of the keys of the user's trigram index, one per bucket of trigrams (the first
    conversations/indexes.py BUCKET_DIGITS hex digits of the SHA-1 of a trigram's UTF-8 bytes,
    a trigram being three characters of a lowercased title): a set of the ids of the
    conversations whose indexed title holds a trigram of that bucket. At most 4,096 keys a
    user, whatever the titles."""
    return f"{PREFIX}:user:{user_id}:convs:trb:"


def user_conversation_titles_v1(user_id: str) -> str:
    """The hash of `conversation-indexes-v1` (id -> indexed title), whose trigrams name the
    user's keys of `user_title_trigrams_v1`: read only to remove both (indexes.py
    `drop_v1`)."""
    return f"{PREFIX}:user:{user_id}:convs:titles"


def user_title_trigrams_v1(user_id: str) -> str:
    """Prefix of `conversation-indexes-v1`'s keys, one per trigram (its UTF-8 bytes appended):
    removed by the v2 migration, user by user (indexes.py `drop_v1`)."""
    return f"{PREFIX}:user:{user_id}:convs:tri:"


def user_cut_titles(user_id: str) -> str:
    """Set of the user's conversation ids whose lowercased title is longer than the trigram
    index holds (TRIGRAM_CHARS): a candidate of every title search, checked on its record.
    Written alike by both versions of the index (whether a title is cut is its record's)."""
    return f"{PREFIX}:user:{user_id}:convs:tri_cut"


def sandbox_conversations(sandbox_id: str) -> str:
    """Set of conversation ids running in a sandbox: a delete keeps a shared sandbox."""
    return f"{PREFIX}:sandbox:{sandbox_id}:convs"


def start_task(task_id: str) -> str:
    """String: AppConversationStartTask JSON."""
    return f"{PREFIX}:task:{task_id}"


def user_start_tasks(user_id: str) -> str:
    """Lexically ordered sorted set of the user's start task ids."""
    return f"{PREFIX}:user:{user_id}:tasks"


USER_START_TASKS_BY_UPDATE = (f"{PREFIX}:user:", ":tasks:updated")
"""Prefix and suffix of user_start_tasks_by_update's keys (for the script that builds them)."""


def user_start_tasks_by_update(user_id: str) -> str:
    """Sorted set of the user's start task ids scored by the task's `updated_at` (integer
    microseconds since the epoch): the updated-at orders' pages (conversations/store.py
    `page_tasks_by_update`), kept with each save of the task."""
    return USER_START_TASKS_BY_UPDATE[0] + user_id + USER_START_TASKS_BY_UPDATE[1]


USER_START_TASKS_BY_CREATION = (f"{PREFIX}:user:", ":tasks:created")
"""Prefix and suffix of user_start_tasks_by_creation's keys."""


def user_start_tasks_by_creation(user_id: str) -> str:
    """Sorted set of the user's start task ids scored by the task's `created_at` (integer
    microseconds since the epoch): a count with `created_at__gte` is one ZCOUNT."""
    return USER_START_TASKS_BY_CREATION[0] + user_id + USER_START_TASKS_BY_CREATION[1]


CONVERSATION_START_TASKS = f"{PREFIX}:conv_tasks:"
"""Prefix of conversation_start_tasks' keys."""


def conversation_start_tasks(conversation_id: str) -> str:
    """Set of the ids of the start tasks that made (or are making) a conversation, kept with
    each save of a task that names it: a conversation's delete and a filter by conversation read
    these, not every task of the user. A member is checked against its task when read."""
    return CONVERSATION_START_TASKS + conversation_id


ACTIVE_START_TASKS = f"{PREFIX}:tasks:active"
"""Set of start task ids not yet READY or ERROR: what a restart must finish or fail."""


def events(conversation_id: str) -> str:
    """Stream of the conversation's events, field `e` = event JSON."""
    return f"{PREFIX}:events:{conversation_id}"


EVENT_INDEX = f"{PREFIX}:event_index"
"""Hash: event id -> "<conversation id> <stream id>", for batch gets by event id. The first
conversation to store an id keeps it: an agent cannot move another conversation's event."""


def events_rewound(conversation_id: str) -> str:
    """List of JSON `{"after", "upto", "checkpoint", "at"}`: the stream ids a rewind of the
    conversation superseded (after, upto], oldest rewind first; the events stay."""
    return f"{PREFIX}:events_rewound:{conversation_id}"


def checkpoints(conversation_id: str) -> str:
    """Hash: checkpoint id (uuid7 hex, time-ordered) -> the checkpoint's JSON record."""
    return f"{PREFIX}:conv:{conversation_id}:checkpoints"


def event_ids(conversation_id: str) -> str:
    """Hash: event id -> stream id within one conversation (dedupe of webhook retries)."""
    return f"{PREFIX}:event_ids:{conversation_id}"


MEMORY_RESERVED = f"{PREFIX}:memory_reserved"
"""Hash: sandbox id -> bytes of memory it reserves while STARTING, RUNNING or PAUSED (a paused
container keeps its memory), summed for the host capacity guard."""

MEMORY_RESERVED_TOTAL = f"{PREFIX}:memory_reserved_total"
"""String: the sum of MEMORY_RESERVED's values, changed with it by the same scripts
(sandboxes/store.py RESERVATIONS), so that admission reads one number, not every sandbox's."""


LIFECYCLE = f"{PREFIX}:lifecycle"
"""Stream of every lifecycle event (admin view), trimmed to lifecycle.publisher.STREAM_MAXLEN."""


def user_lifecycle(user_id: str) -> str:
    """Stream of one user's lifecycle events, trimmed like LIFECYCLE."""
    return f"{PREFIX}:user:{user_id}:lifecycle"


def leader(role: str) -> str:
    """String with a TTL: the token of the replica that leads `role` (e.g. the idle reaper).
    The TTL is a few reaper intervals, so a dead leader is replaced within that time."""
    return f"{PREFIX}:leader:{role}"


def rate_limit(key_id: str) -> str:
    """Counter of one API key's requests in its current window. TTL = the window (60 s), set by
    the window's first request, so the count resets by itself and idle keys leave nothing."""
    return f"{PREFIX}:ratelimit:{key_id}"


def webhook_outbox(url_id: str) -> str:
    """Stream of the lifecycle events still to deliver to one webhook URL (url_id: a hash of the
    URL, which may carry a token), with the consumer group `deliverers`. An entry is deleted
    once delivered or dead-lettered: the stream's length is the backlog."""
    return f"{PREFIX}:webhooks:outbox:{url_id}"


def webhook_dead(url_id: str) -> str:
    """Stream of the events one webhook URL never accepted within the dead-letter time, with the
    attempts and the last error (trimmed, approximately, to the newest 10,000)."""
    return f"{PREFIX}:webhooks:dead:{url_id}"


def start_task_lease(task_id: str) -> str:
    """String with a TTL (conversations.starter.LEASE_TTL): set while a replica runs the task and
    renewed by it, so a replica starting up fails only tasks nobody is running any more."""
    return f"{PREFIX}:task_lease:{task_id}"


def browser_session(session_hash: str) -> str:
    """Hash: user, key id, admin flag of a browser session, under the sha256 of its id. Expires
    with the session (EXPIREAT), so an abandoned one leaves nothing; sign-out deletes it."""
    return f"{PREFIX}:session:{session_hash}"


def device_code(code_hash: str) -> str:
    """Hash: one device authorization (RFC 8628) under the sha256 of its device code: user code,
    status, approving user, expiry, poll interval. TTL = its lifetime plus
    auth.device.EXPIRED_GRACE, so a late poll still learns `expired_token`."""
    return f"{PREFIX}:device:{code_hash}"


def ws_ticket(ticket_hash: str) -> str:
    """String, TTL auth.tickets.TICKET_TTL: a WebSocket ticket under the sha256 of the ticket
    (JSON: user, admin flag, key id, scope, target); taken with GETDEL, so used once."""
    return f"{PREFIX}:ws_ticket:{ticket_hash}"


def device_user_code(user_code: str) -> str:
    """String: the device code hash for a user code. TTL = the code's lifetime: an expired code
    can no longer be approved."""
    return f"{PREFIX}:device_user:{user_code}"


def pending_messages(owner: str) -> str:
    """List of JSON messages queued for a conversation (`owner` = its id) or, before the
    conversation exists, for its start task (`task-<task id>`), oldest first; at most
    conversations.pending.MAX_PENDING. Emptied as they reach the agent."""
    return f"{PREFIX}:pending:{owner}"


def pending_delivery(conversation_id: str) -> str:
    """String with a TTL: held by the one request delivering a conversation's pending messages,
    so two deliveries never send the same message."""
    return f"{PREFIX}:pending_lock:{conversation_id}"


SECRET_KEY_CHECK = f"{PREFIX}:secret_key_check"
"""String, no TTL: the HMAC of a fixed label under the deployment's secret key, written by the
first replica to start; a replica whose key gives another value refuses to start
(controlplane/crypto.py, check_shared_key)."""

SANDBOX_STATUS_CHANNEL = f"{PREFIX}:sandbox_status"
"""Pub/sub channel (not a key): "<sandbox id> <status>" published with every status change,
create and delete, so that waiters on any replica wake at once."""


def sandbox_lease(sandbox_id: str) -> str:
    """String, TTL 3 s, renewed: the token of the replica carrying the sandbox's pending start,
    resume or delete to completion. When it expires, the next sweep takes the work over."""
    return f"{PREFIX}:sandbox_lease:{sandbox_id}"


POOL_MEMBERS = f"{PREFIX}:pool:members"
"""Lexically ordered sorted set of unclaimed warm pool member ids (never in ALL_SANDBOXES)."""

POOL_STATS = f"{PREFIX}:pool:stats"
"""Hash: `claims:<spec>`, `misses:<spec>` and `share_misses:<spec>` counters (every replica's
claims)."""

POOL_CLAIMED = f"{PREFIX}:pool:claimed"
"""String with a TTL of ACS_POOL_REFILL_DELAY, set by every claim on any replica: while it
lives the pool's refiller holds its launches (a burst of claims is served first)."""


def pool_org_claims(spec_id: str, org_id: str, window: int) -> str:
    """String, TTL one window (ACS_POOL_SHARE_WINDOW): the warm-pool members of one spec an
    organization with a `warm_pool_share` claimed in the window."""
    return f"{PREFIX}:pool:share:{spec_id}:{org_id}:{window}"


def pool_ready(spec_id: str) -> str:
    """Lexically ordered sorted set of the spec's members a claim may pop, oldest first."""
    return f"{PREFIX}:pool:ready:{spec_id}"


def llm_gateway_key(key_id: str) -> str:
    """Hash: a user's LLM gateway key (controlplane/gateway): user, sha256, the key encrypted
    (GET /api/keys/llm/byor answers it again), created_at."""
    return f"{PREFIX}:llmkey:{key_id}"


def user_llm_gateway_key(user_id: str) -> str:
    """String: the id of the user's current LLM gateway key."""
    return f"{PREFIX}:user:{user_id}:llmkey"


def llm_usage_conversation(conversation_id: str) -> str:
    """Hash: what the LLM gateway metered for one conversation: cost (USD), prompt_tokens,
    completion_tokens, requests."""
    return f"{PREFIX}:llm_usage:conv:{conversation_id}"


def llm_usage_org(org_id: str, month: str) -> str:
    """Hash, TTL about 13 months: the organization's gateway usage in one calendar month, the
    same fields; the organization's budget counts it."""
    return f"{PREFIX}:llm_usage:org:{org_id}:{month}"


def llm_usage_member(org_id: str, user_id: str, month: str) -> str:
    """Hash, TTL about 13 months: one member's gateway usage in the organization in one month
    (their calls charged to it), the same fields; the member's budget there counts it."""
    return f"{PREFIX}:llm_usage:org:{org_id}:member:{user_id}:{month}"


def llm_usage_user(user_id: str, month: str) -> str:
    """Hash, TTL about 13 months: the user's gateway usage in one calendar month (UTC,
    `YYYY-MM`), the same fields; the per-user budget counts it."""
    return f"{PREFIX}:llm_usage:user:{user_id}:{month}"


def user_api_keys(user_id: str) -> str:
    """Sorted set of a user's API key ids scored by creation time: what the user (and admins)
    list and revoke."""
    return f"{PREFIX}:user:{user_id}:apikeys"


def oidc_state(state_hash: str) -> str:
    """Hash, TTL organizations.oidc_flow.STATE_TTL: one started OpenID sign-in under the sha256
    of its state: the nonce, the PKCE verifier (encrypted), the browser binding's hash, the
    redirect URI and where to go after. Taken (deleted) by the one callback that redeems it."""
    return f"{PREFIX}:oidc_state:{state_hash}"


def session_recheck_lock(session_hash: str) -> str:
    """String, TTL a few seconds: the replica re-checking a browser session with the provider."""
    return f"{PREFIX}:session_recheck:{session_hash}"


def organization(org_id: str) -> str:
    """Hash: an organization's name, creation time and maker, and its limits (quotas)."""
    return f"{PREFIX}:org:{org_id}"


ORGANIZATIONS = f"{PREFIX}:orgs"
"""Sorted set of organization ids (lexical): listing without a scan."""


def org_members(org_id: str) -> str:
    """Hash: user id -> role in the organization (written with user_orgs in one transaction)."""
    return f"{PREFIX}:org:{org_id}:members"


def user_orgs(user_id: str) -> str:
    """Hash: organization id -> the user's role there, plus `~current` (the organization the user
    acts in when a request names none) and `~known` (the user's memberships are managed: an
    empty set of organizations means none, not the default one). One HGETALL per request."""
    return f"{PREFIX}:user:{user_id}:orgs"


def org_member_limits(org_id: str, user_id: str) -> str:
    """Hash: one member's own limits in the organization (overriding the organization's)."""
    return f"{PREFIX}:org:{org_id}:limits:{user_id}"


MIGRATIONS = f"{PREFIX}:migrations"
"""Set of the data migrations applied (organizations.migration, store/audit_backfill.py): each
runs once."""
MIGRATIONS_LOCK = f"{MIGRATIONS}:lock"
"""The replica applying the organizations migration (organizations/migration.py; a LeaderLock:
it expires with a dead holder, and only its holder's token frees it)."""


REPLICA_ADDRESSES = f"{PREFIX}:replica_addresses"
"""Hash: replica id -> JSON {"addresses": [...], "at": epoch seconds}: each replica's host
addresses, written by itself every half minute (controlplane/outbound/sources.py), so that no
replica connects to another's for a user; an entry not renewed for a day is dropped."""


# -- snapshots (controlplane/snapshots/store.py) -------------------------------------------------


def snapshot(snapshot_id: str) -> str:
    """Hash: a snapshot record (PENDING while it is taken, READY once listed)."""
    return f"{PREFIX}:snapshot:{snapshot_id}"


def snapshot_uploads(snapshot_id: str) -> str:
    """Set: the blobs a snapshot being taken has sent (or is sending) to the store, written
    before each upload, so that whoever finds it abandoned deletes them."""
    return f"{PREFIX}:snapshot:{snapshot_id}:uploads"


def user_snapshots(user_id: str) -> str:
    """Lexically ordered sorted set of the user's READY snapshot ids (paging, the count quota)."""
    return f"{PREFIX}:user:{user_id}:snapshots"


def sandbox_snapshots(sandbox_id: str) -> str:
    """Lexically ordered sorted set of the READY snapshot ids taken of a sandbox (the latest is
    the parent of the next; retention keeps the last N). Kept after the sandbox's delete."""
    return f"{PREFIX}:sandbox:{sandbox_id}:snapshots"


SNAPSHOT_SANDBOXES = f"{PREFIX}:snapshot_sandboxes"
"""Lexically ordered sorted set of sandbox ids that have snapshots (the retention pass)."""
PENDING_SNAPSHOTS = f"{PREFIX}:snapshots:pending"
"""Sorted set of PENDING snapshot ids scored by their lease's expiry (Unix seconds)."""
FORKED_SNAPSHOTS = f"{PREFIX}:snapshots:forked"
"""Set of the snapshot ids that have a snapshot_forks record (the collector's pass reads it,
not a scan of the whole keyspace); an id whose record expired goes at that pass."""


def snapshot_forks(snapshot_id: str) -> str:
    """Set, TTL a day: the sandboxes a fork started from a snapshot still being sealed into
    the store (deleted once it is listed); the collector deletes them with it if it is
    abandoned instead (the control plane forking it died)."""
    return f"{PREFIX}:snapshot_forks:{snapshot_id}"


def snapshot_lock(sandbox_id: str) -> str:
    """String, TTL 15 s, renewed: the snapshot id being taken of a sandbox (one at a time)."""
    return f"{PREFIX}:snapshot_lock:{sandbox_id}"


def user_packs(user_id: str) -> str:
    """Hash: pack digest -> how many READY snapshots of the user use it; 0: doomed (in
    DOOMED_PACKS), revived if a snapshot reuses it before it is collected."""
    return f"{PREFIX}:user:{user_id}:packs"


def user_pack_sizes(user_id: str) -> str:
    """Hash: pack digest -> its size in bytes (what the byte quota counts)."""
    return f"{PREFIX}:user:{user_id}:pack_sizes"


def user_chunks(user_id: str) -> str:
    """Hash: chunk id -> "<pack digest> <offset> <length>": where the user's content is, so
    identical content is stored once across their snapshots."""
    return f"{PREFIX}:user:{user_id}:chunks"


def pack_chunks(user_id: str, digest: str) -> str:
    """String: the chunk ids in one pack (space-separated), dropped from user_chunks with it."""
    return f"{PREFIX}:user:{user_id}:pack:{digest}"


def user_snapshot_bytes(user_id: str) -> str:
    """String: bytes of the user's packs and indexes in the store (the byte quota)."""
    return f"{PREFIX}:user:{user_id}:snapshot_bytes"


DOOMED_PACKS = f"{PREFIX}:snapshots:doomed"
"""Sorted set of "<user> <digest>" no snapshot uses, scored by when (the collector deletes
them after ACS_SNAPSHOT_COLLECT_GRACE)."""
STORE_DELETIONS = f"{PREFIX}:snapshots:deletions"
"""Set of "<repository> <blob|manifest> <digest>" to delete from the store: written with the
change that orphaned them, removed once the store confirms (at least once)."""
STORE_SETTLING = f"{PREFIX}:snapshots:settling"
"""Sorted set of STORE_DELETIONS entries that an abandoned snapshot was sending, scored by
when the store can no longer land them (ACS_SNAPSHOT_UPLOAD_SETTLE after the abandon): until
then a "not there" answer to their deletion is not final (the upload may land after it)."""
ORPHANED_SANDBOXES = f"{PREFIX}:snapshots:orphaned"
"""Hash: sandbox id -> when the retention pass first found it deleted (Unix seconds): its
unnamed snapshots are kept ACS_SNAPSHOT_ORPHAN_RETENTION from then."""


AUDIT = f"{PREFIX}:audit"
"""Stream: every audit entry (controlplane/store/audit.py), trimmed by age (ACS_AUDIT_RETENTION);
the indexes below hold an empty entry with the same stream id, written by the indexer
(store/audit_index.py) up to AUDIT_INDEXED."""
AUDIT_INDEXED = f"{PREFIX}:audit:indexed"
"""String: the stream id of the newest entry of AUDIT the indexes hold (the indexer's watermark;
a search reads the log itself past it)."""

AUDIT_NO_ORG = "~"
"""The organization of entries that have none (a sign-in, a failed one)."""


def audit_org(org_id: str) -> str:
    """Stream: the organization's audit entries (index: same ids as AUDIT, no fields of its own).
    Every audit index is trimmed by age and expires one retention after its last entry."""
    return f"{PREFIX}:audit:org:{org_id}"


def audit_org_action(org_id: str, action: str) -> str:
    """Stream: the organization's audit entries of one action (index)."""
    return f"{PREFIX}:audit:org:{org_id}:action:{action}"


def audit_action(action: str) -> str:
    """Stream: the audit entries of one action, in every organization (index)."""
    return f"{PREFIX}:audit:action:{action}"


def audit_user(user_id: str) -> str:
    """Stream: the audit entries of what one user did, in every organization (index)."""
    return f"{PREFIX}:audit:user:{user_id}"


def audit_org_user(org_id: str, user_id: str) -> str:
    """Stream: the organization's audit entries of what one user did there (index). An
    organization's own reader searches its per-organization indexes only, so that nothing it
    reads (a page, a cursor, how long a search takes) depends on another organization's
    entries; the deployment-wide indexes are for deployment admins."""
    return f"{PREFIX}:audit:org:{org_id}:user:{user_id}"


def audit_org_target(org_id: str, target_id: str) -> str:
    """Sorted set as audit_target: the organization's entries naming one id (index)."""
    return f"{PREFIX}:audit:org:{org_id}:target:{target_id}"


def audit_target(target_id: str) -> str:
    """Sorted set, every score 0: the stream ids (streams.lex_member) of the audit entries
    naming one id (a sandbox, conversation, key, user, …) among their targets (index; a sorted
    set because most hold a few entries, where a stream would cost 4 kB)."""
    return f"{PREFIX}:audit:target:{target_id}"


AUDIT_BACKFILL = f"{PREFIX}:migrations:audit-org-indexes"
"""Hash: the backfill of the per-organization indexes in progress (store/audit_backfill.py):
`high` (the newest entry it covers) and `at` (the last one it read). Gone once it is done. Its
keys are the migrations', not the audit log's (`acs:audit*` is the log alone)."""
AUDIT_BACKFILL_LOCK = f"{AUDIT_BACKFILL}:lock"
"""The replica running the backfill (a LeaderLock: it expires with a dead holder)."""
AUDIT_BACKFILL_STAGED = f"{AUDIT_BACKFILL}:staged"
"""Set: the per-organization user indexes rebuilt in a staging stream, not yet put in place."""


def audit_backfill_stage(index: str) -> str:
    """Stream: the per-organization user index `index` as the backfill rebuilds it from the log
    (renamed to `index` when complete); expires as the index would."""
    return f"{AUDIT_BACKFILL}:stage:{index}"


def audit_anonymous(window: int, part: str) -> str:
    """The anonymous-failure gate's counters of one window (controlplane/store/audit_flood.py):
    `all` (entries written), `src:<source>` (per source), `dropped` (entries not written) and
    `sources` (HyperLogLog of the sources dropped); each expires after its window, but the
    dropped ones, which live until their summary entry is written."""
    return f"{PREFIX}:audit:anon:{window}:{part}"


AUDIT_ANONYMOUS_PENDING = f"{PREFIX}:audit:anon:pending"
"""Sorted set: the windows whose dropped anonymous failures await their summary entry."""


def audit_outbox(url_id: str) -> str:
    """Stream + consumer group `deliverers`: audit entries (JSON) not yet delivered to one sink
    (ACS_AUDIT_SINKS; url id as for webhook_outbox)."""
    return f"{PREFIX}:audit:outbox:{url_id}"


def audit_dead(url_id: str) -> str:
    """Stream, newest ~10,000: audit deliveries given up (as webhook_dead)."""
    return f"{PREFIX}:audit:dead:{url_id}"
