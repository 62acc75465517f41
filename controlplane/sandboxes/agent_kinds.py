"""The container environment each agent kind needs beyond what every sandbox gets (the session
key, the webhook base URL, the CORS origins: launcher.container_request).

Our agent (`acs`) needs nothing more. The official OpenHands agent server (`openhands`) is
configured by `OH_*` variables (docs/sandboxes.md#agent-kinds): its state under the agent's state
directory, VSCode, the browser and tool preloading off unless the spec turns them on, litellm
kept offline, UTC local time (its timestamps are naive local time), and webhooks that neither
drop an event nor send a batch our body limit refuses.
"""

from __future__ import annotations

from controlplane.specs.models import OpenHandsOptions, SandboxSpec

#: Where the official server keeps conversations and bash events: the directory the images give
#: the agent user for its state (a tmpfs under a read-only root, like ours).
STATE_DIR = "/var/lib/acs-agent"
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
        "OH_CONVERSATIONS_PATH": f"{STATE_DIR}/conversations",
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
