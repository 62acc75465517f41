"""The container environment each agent kind needs beyond what every sandbox gets (the session
key, the webhook base URL, the CORS origins: controlplane/sandboxes/launcher.py,
sandbox_request).

Our agent (`acs`) needs nothing more. The official OpenHands agent server (`openhands`) is
configured by `OH_*` variables (docs/sandboxes.md#agent-kinds): its state under the agent's state
directory, VSCode, the browser and tool preloading off unless the spec turns them on, litellm
kept offline, UTC local time (its timestamps are naive local time), and webhooks that neither
drop an event nor send a batch our body limit refuses.
"""

from __future__ import annotations

import uuid

import aiohttp
import structlog

from controlplane.agent_protocol.start_request import start_conversation_request
from controlplane.specs.models import OpenHandsOptions, SandboxSpec

log = structlog.get_logger(__name__)

#: Where the official server keeps conversations and bash events: the directory the images give
#: the agent user for its state (a tmpfs under a read-only root), where ours keeps its own too.
#: A runtime that makes a new instance at each resume (Kubernetes) keeps it with the workspace.
STATE_DIR = "/var/lib/acs-agent"
#: Where both kinds keep their conversations, a directory each, named by the conversation's id.
CONVERSATIONS_DIR = f"{STATE_DIR}/conversations"
#: What a conversation's fork carries of the agent's stored conversation into the new sandbox,
#: under the new id: its events, from which both kinds make the model's context, and nothing
#: else. Ours (agent/conversations/persistence.py): events.jsonl and history.jsonl, masked by the
#: agent; the official server: its events/ directory (one JSON file an event). Not meta.json
#: (ours: the source's gateway token and the user's secrets) nor base_state.json (the official
#: server's agent and secrets, sealed with the source sandbox's session key): the new
#: conversation is started with its own (docs/sandboxes.md#checkpoints).
CARRIED_FILES = frozenset({"events.jsonl", "history.jsonl", "events"})
#: Files of a stored conversation that say which running server owns it: the official server's
#: leases (openhands/agent_server/conversation_lease.py). Never restored by a rewind: the owner
#: died with the sandbox's instance, but the lease names a host the rebuilt one is not, so the
#: server would refuse the conversation ("Conversation not found") until the lease expired, up
#: to 45 s after the checkpoint.
OWNER_MARKS = frozenset({"owner_lease.json", ".owner_lease.lock"})
#: A batch is flushed this long after its first event (the server's default is 30 s).
FLUSH_DELAY_S = 0.05
#: Events a batch may hold before it is posted at once, even within the flush delay.
BUFFER_EVENTS = 100
#: A failed post is retried every RETRY_DELAY_S for NUM_RETRIES times (10 minutes) before the
#: server gives the batch up; our webhook listener answers again within seconds of a restart.
NUM_RETRIES = 120
RETRY_DELAY_S = 5
#: Events held for delivery while the control plane does not answer (the default 1000 could
#: drop the oldest during a long outage; the byte bound, 50 MiB by default, still applies).
MAX_QUEUE_EVENTS = 100_000


def max_batch_bytes(max_body_bytes: int) -> int:
    """The server measures a batch as compact UTF-8 JSON but posts it with ASCII escapes and
    spaces after separators: a character outside the BMP grows from 4 bytes to 12. A quarter of
    our body limit keeps any batch of several events under it."""
    return max(1024, max_body_bytes // 4)


def agent_env(spec: SandboxSpec, *, max_body_bytes: int, webhooks: bool) -> dict[str, str]:
    """Environment for the spec's agent kind (`webhooks`: the sandbox posts to the control
    plane). The caller applies the spec's `initial_env` over it, so an operator can tune it."""
    if spec.agent_kind != "openhands":
        return {}
    options = spec.openhands or OpenHandsOptions()
    env = {
        "TZ": "UTC",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OH_CONVERSATIONS_PATH": CONVERSATIONS_DIR,
        "OH_BASH_EVENTS_DIR": f"{STATE_DIR}/bash_events",
        "OH_ENABLE_VSCODE": _flag(options.vscode),
        "OH_ENABLE_BROWSER": _flag(options.browser),
        # Preloading starts chromium for the browser tool; without it there is nothing to load.
        "OH_PRELOAD_TOOLS": _flag(options.browser),
    }
    if webhooks:
        webhook = {
            "EVENT_BUFFER_SIZE": str(BUFFER_EVENTS),
            "FLUSH_DELAY": str(FLUSH_DELAY_S),
            "NUM_RETRIES": str(NUM_RETRIES),
            "RETRY_DELAY": str(RETRY_DELAY_S),
            "MAX_QUEUE_SIZE": str(MAX_QUEUE_EVENTS),
            "MAX_BATCH_BYTES": str(max_batch_bytes(max_body_bytes)),
        }
        env.update({f"OH_WEBHOOKS_0_{name}": value for name, value in webhook.items()})
    return env


def _flag(value: bool) -> str:
    return "true" if value else "false"


async def warm_up(spec: SandboxSpec, url: str, key: str) -> None:
    """What a warm-pool member's agent server would otherwise do at its first conversation, done
    before anyone claims it. The official server sets its tools up then (a second or more): it
    gets a conversation that has no message (so no model call), deleted at once. Ours loads its
    conversations' code at the first conversation call (agent/conversations/mount.py, ~0.1 s of
    CPU): it gets one count of its conversations, and its first command. Failures are only
    logged: the member is usable all the same."""
    headers = {"X-Session-API-Key": key}
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            if spec.agent_kind == "openhands":
                await _first_conversation(http, spec, url)
            else:
                async with http.get(f"{url}/api/conversations/count") as resp:
                    resp.raise_for_status()
                await _first_command(http, url)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("agent_warm_up_failed", url=url, error=repr(exc))


async def _first_command(http: aiohttp.ClientSession, url: str) -> None:
    """An agent server's first command costs it several times a later one's CPU (its code
    paths run the first time, the shell's first exec: 5-8 ms more here), which a burst of
    claims pays once per member, all on the host's cores at once (bench/README.md, the burst):
    one (`true`) is run now, then forgotten (the member has run nothing else: clearing the
    finished commands leaves its history empty, as a new sandbox's is)."""
    async with http.post(f"{url}/api/bash/execute_bash_command", json={"command": "true"}) as resp:
        resp.raise_for_status()
    async with http.delete(f"{url}/api/bash/bash_events") as resp:
        resp.raise_for_status()


async def _first_conversation(http: aiohttp.ClientSession, spec: SandboxSpec, url: str) -> None:
    body = start_conversation_request(
        conversation_id=uuid.uuid4().hex,
        llm={"model": "openai/warm-up", "api_key": "warm-up"},
        working_dir=spec.working_dir,
        initial_message=None,
        max_iterations=1,
        max_budget_per_task=None,
        confirmation_mode=False,
        secrets={},
        mcp_config=None,
        system_message_suffix=None,
        agent_kind=spec.agent_kind,
    )
    async with http.post(f"{url}/api/conversations", json=body) as resp:
        resp.raise_for_status()
    async with http.delete(f"{url}/api/conversations/{body['conversation_id']}") as resp:
        resp.raise_for_status()
