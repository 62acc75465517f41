"""The per-task budget for agent servers that have none (the official OpenHands agent server).

Our agent stops itself when a conversation's cost passes `max_budget_per_task`. The official
server ignores that field, so the control plane enforces it when it ingests the cost: each stats
update that raises the cost above the budget records a ``ConversationErrorEvent``
(``BudgetExceeded``, as our agent writes it) in the conversation's stream and pauses the
conversation through the agent API. A message or `run` afterwards gets one more LLM call, whose
cost stops it again, as with our agent (docs/conversations.md#budgets).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import structlog

from controlplane.agent_protocol.client import AgentClient
from controlplane.agent_protocol.models import MetricsSnapshot
from controlplane.background import stop_tasks
from controlplane.conversations.models import AppConversationInfo
from controlplane.errors import ControlPlaneError
from controlplane.events.store import EventStore
from controlplane.sandboxes.models import SandboxRecord

log = structlog.get_logger(__name__)

#: Agent kinds whose server enforces `max_budget_per_task` itself.
ENFORCED_BY_AGENT = frozenset({"acs"})


def crossed(before: MetricsSnapshot | None, after: MetricsSnapshot, budget: float | None) -> bool:
    """Did this update raise the cost to above the budget (a new LLM call over it)?"""
    if budget is None:
        return False
    previous = before.accumulated_cost if before is not None else 0.0
    return after.accumulated_cost > budget and after.accumulated_cost > previous


def budget_error_event(cost: float, budget: float) -> dict[str, Any]:
    """As our agent records it; naive UTC ISO time like the SDK's events."""
    return {
        "kind": "ConversationErrorEvent",
        "id": str(uuid.uuid4()),
        "timestamp": datetime.now(UTC).replace(tzinfo=None).isoformat(),
        "source": "environment",
        "code": "BudgetExceeded",
        "detail": f"Accumulated cost ${cost:.6f} exceeds the budget of ${budget:.6f}; "
        "the control plane paused the conversation.",
    }


class BudgetEnforcer:
    """Records the error and pauses the conversation in the background: the webhook that
    brought the cost must not wait for the agent server it came from."""

    def __init__(self, agent: AgentClient, events: EventStore) -> None:
        self._agent = agent
        self._events = events
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: set[str] = set()

    def enforce(self, agent_url: str, sandbox: SandboxRecord, info: AppConversationInfo) -> None:
        """One stop at a time per conversation: a call that lands while its pause is on the way
        (the step in flight) is covered by that pause."""
        if info.id in self._stopping:
            return
        self._stopping.add(info.id)
        task = asyncio.create_task(self._stop(agent_url, sandbox, info), name=f"budget-{info.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _t: self._stopping.discard(info.id))

    async def _stop(
        self, agent_url: str, sandbox: SandboxRecord, info: AppConversationInfo
    ) -> None:
        metrics = info.metrics or MetricsSnapshot()
        budget = metrics.max_budget_per_task or 0.0
        log.info(
            "conversation_over_budget",
            conversation_id=info.id,
            cost=metrics.accumulated_cost,
            budget=budget,
        )
        try:
            await self._events.append(
                info.id, [budget_error_event(metrics.accumulated_cost, budget)]
            )
            await self._agent.pause(agent_url, sandbox.session_api_key, info.id)
        except ControlPlaneError as exc:
            log.warning("budget_pause_failed", conversation_id=info.id, error=str(exc))

    async def close(self) -> None:
        await stop_tasks(list(self._tasks))
