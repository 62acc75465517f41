"""State of one conversation: events, LLM history, status, stats; emitting and saving them."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

import aiohttp

from . import events as ev
from .llm import LLMClient, LLMResponse
from .masking import Masker
from .models import ExecutionStatus, StartConversationRequest, dashed
from .persistence import ConversationFiles
from .tools import Toolbox
from .webhooks import WebhookSender

if TYPE_CHECKING:
    from .mcp_tools import MCPManager

log = logging.getLogger(__name__)


def iso_now() -> str:
    """ISO 8601 UTC with a ``Z``, for ``created_at``/``updated_at``."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Decision(Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    PAUSE = "pause"


@dataclass
class PendingCall:
    """An ActionEvent emitted and not yet run (or waiting for confirmation)."""

    action_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]  # the SDK Action dump


@dataclass
class State:
    """What is saved in meta.json besides the request."""

    status: ExecutionStatus = ExecutionStatus.IDLE
    created_at: str = field(default_factory=iso_now)
    updated_at: str = field(default_factory=iso_now)
    title: str | None = None
    iterations: int = 0
    accumulated_cost: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_prompt_tokens: int = 0
    last_response_id: str = ""
    system_prompt_sent: bool = False
    security_analyzer: dict[str, Any] | None = None
    inbox: list[dict[str, Any]] = field(default_factory=list)  # user messages not yet sent
    pending: list[PendingCall] = field(default_factory=list)


class Conversation:
    def __init__(
        self,
        conversation_id: str,
        request: StartConversationRequest,
        *,
        state: State,
        masker: Masker,
        files: ConversationFiles,
        webhooks: WebhookSender | None,
        llm: LLMClient,
        toolbox: Toolbox,
        mcp: MCPManager | None,
        http: aiohttp.ClientSession,
    ) -> None:
        self.id = conversation_id
        self.request = request
        self.state = state
        self.masker = masker
        self.files = files
        self.webhooks = webhooks
        self.llm = llm
        self.toolbox = toolbox
        self.mcp = mcp
        self.http = http  # for LookupSecrets
        self.closed = False  # deleted: live sockets end
        self.events: list[dict[str, Any]] = []
        self.event_index: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
        self.listeners: set[asyncio.Event] = set()
        self.task: asyncio.Task[None] | None = None
        self.mcp_started: asyncio.Task[None] | None = None
        self.pause_requested = False
        self._decision: asyncio.Future[tuple[Decision, str]] | None = None

    # --- events and state -------------------------------------------------

    @property
    def status(self) -> ExecutionStatus:
        return self.state.status

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    @property
    def confirms(self) -> bool:
        return self.request.confirmation_policy.confirms

    def emit(self, event: ev.Event) -> ev.Event:
        """Mask, keep, save and send one event (webhook and live sockets); returns it as sent."""
        data: ev.Event = self.masker.mask(event)
        self.event_index[data["id"]] = len(self.events)
        self.events.append(data)
        self.state.updated_at = iso_now()
        self.files.append_event(data)
        if self.webhooks is not None:
            self.webhooks.send_event(data)
        for listener in self.listeners:
            listener.set()
        return data

    def load_events(self, events: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
        for data in events:
            self.event_index[data["id"]] = len(self.events)
            self.events.append(data)
        self.history.extend(history)

    def add_history(self, message: dict[str, Any]) -> None:
        masked: dict[str, Any] = self.masker.mask(message)
        self.history.append(masked)
        self.files.append_history(masked)

    def set_status(self, status: ExecutionStatus) -> None:
        if status == self.state.status:
            return
        self.state.status = status
        self.emit(ev.state_update_event("execution_status", status.value))
        self.changed()

    def changed(self) -> None:
        """Save the state and tell the control plane (status, title or stats changed)."""
        self.state.updated_at = iso_now()
        self.save()
        if self.webhooks is not None:
            self.webhooks.send_info(self.info())

    def save(self) -> None:
        self.files.write_meta(self.meta())

    def meta(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "request": self.request.model_dump(mode="json"),
            "state": asdict(self.state),
        }

    # --- ConversationInfo -----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The SDK's ``ConversationStats`` (one usage id: the agent's LLM), as snapshots."""
        llm = self.request.agent.llm
        s = self.state
        snapshot = {
            "model_name": llm.model,
            "accumulated_cost": s.accumulated_cost,
            "max_budget_per_task": self.request.max_budget_per_task,
            "accumulated_token_usage": {
                "model": llm.model,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
                "reasoning_tokens": 0,
                "context_window": 0,
                "per_turn_token": s.last_prompt_tokens,
                "response_id": s.last_response_id,
            },
        }
        return {"usage_to_metrics": {llm.usage_id: snapshot}}

    def metrics(self) -> dict[str, Any]:
        """All usage combined (one LLM), as the SDK's ``MetricsSnapshot``."""
        usage: dict[str, Any] = self.stats()["usage_to_metrics"][self.request.agent.llm.usage_id]
        return usage

    def info(self) -> dict[str, Any]:
        """The official ``ConversationInfo`` shape, plus ``status``, ``iterations``,
        ``confirmation_mode`` and ``pending_action_ids`` (ours). Secrets are masked."""
        s = self.state
        request = self.request
        pending = [p.action_id for p in s.pending] if self.confirms else []
        agent = self.masker.mask(request.agent.model_dump(mode="json", exclude_none=True))
        return {
            "id": dashed(self.id),
            "agent": agent,
            "workspace": {
                "kind": "LocalWorkspace",
                "working_dir": str(self.toolbox.context.working_dir),
            },
            "persistence_dir": str(self.files.directory) if self.files.directory else None,
            "max_iterations": request.max_iterations,
            "stuck_detection": request.stuck_detection,
            "execution_status": s.status.value,
            "status": s.status.value,
            "confirmation_policy": request.confirmation_policy.dump(),
            "security_analyzer": s.security_analyzer,
            "activated_knowledge_skills": [],
            "invoked_skills": [],
            "stats": self.stats(),
            "title": s.title,
            "metrics": self.metrics(),
            "created_at": s.created_at,
            "updated_at": s.updated_at,
            "tags": dict(request.tags),
            "iterations": s.iterations,
            "confirmation_mode": self.confirms,
            "pending_action_ids": pending,
        }

    def record_completion(self, response: LLMResponse) -> None:
        """Count one LLM call: stats, a ``stats`` state update (and a completion log when the
        LLM has ``log_completions``), then a conversation webhook."""
        llm = self.request.agent.llm
        cost = response.prompt_tokens * (llm.input_cost_per_token or 0.0) + (
            response.completion_tokens * (llm.output_cost_per_token or 0.0)
        )
        s = self.state
        s.iterations += 1
        s.accumulated_cost += cost
        s.prompt_tokens += response.prompt_tokens
        s.completion_tokens += response.completion_tokens
        s.last_prompt_tokens = response.prompt_tokens
        s.last_response_id = response.id or ""
        if llm.log_completions:
            log_data = {
                "model": llm.model,
                "response_id": response.id,
                "latency_ms": response.latency_ms,
                "attempts": response.attempts,
                "usage": {
                    "prompt_tokens": response.prompt_tokens,
                    "completion_tokens": response.completion_tokens,
                },
                "cost": cost,
                "content": response.content,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in response.tool_calls
                ],
            }
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
            self.emit(
                ev.llm_completion_log_event(
                    filename=f"{llm.model.replace('/', '__')}-{stamp}.json",
                    log_data=json.dumps(log_data),
                    model_name=llm.model,
                    usage_id=llm.usage_id,
                )
            )
        self.emit(ev.state_update_event("stats", self.stats()))
        self.changed()

    def stop(
        self, status: ExecutionStatus, reason: str, error: tuple[str, str] | None = None
    ) -> None:
        """End a run: optional ConversationErrorEvent, the stop_reason, then the status."""
        if error is not None:
            self.emit(ev.conversation_error_event(error[0], error[1]))
        self.emit(ev.state_update_event("stop_reason", reason))
        self.set_status(status)

    def full_state(self) -> ev.Event:
        """A ``full_state`` update for a new socket subscriber (never stored)."""
        event: ev.Event = self.masker.mask(ev.state_update_event(ev.FULL_STATE, self.info()))
        return event

    # --- confirmation -------------------------------------------------------

    async def await_confirmation(self) -> tuple[Decision, str]:
        if self.pause_requested:
            return Decision.PAUSE, ""
        self._decision = asyncio.get_running_loop().create_future()
        self.set_status(ExecutionStatus.WAITING_FOR_CONFIRMATION)
        try:
            return await self._decision
        finally:
            self._decision = None

    @property
    def waiting(self) -> bool:
        return self._decision is not None and not self._decision.done()

    def decide(self, decision: Decision, reason: str = "") -> bool:
        if not self.waiting:
            return False
        assert self._decision is not None
        self._decision.set_result((decision, reason))
        return True
