"""State of one conversation: events, LLM history, status, metrics; emitting and saving them."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .events import (
    ConversationErrorEvent,
    ConversationStateUpdateEvent,
    Event,
    LLMCompletionLogEvent,
    utc_now,
)
from .llm import LLMClient, LLMResponse
from .masking import Masker
from .models import (
    ConversationInfo,
    ExecutionStatus,
    Metrics,
    StartConversationRequest,
    TokenUsage,
)
from .persistence import ConversationFiles
from .tools import Toolbox
from .webhooks import WebhookSender

if TYPE_CHECKING:
    from .mcp_tools import MCPManager

log = logging.getLogger(__name__)


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
    args: dict[str, Any]


@dataclass
class State:
    """What is saved in meta.json besides the request."""

    status: ExecutionStatus = ExecutionStatus.IDLE
    created_at: str = field(default_factory=utc_now)
    updated_at: str = field(default_factory=utc_now)
    title: str | None = None
    iterations: int = 0
    accumulated_cost: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
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
        self.events: list[dict[str, Any]] = []
        self.event_index: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
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

    def emit(self, event: Event) -> dict[str, Any]:
        """Mask, keep, save and send one event; returns it as sent."""
        data: dict[str, Any] = self.masker.mask(event.model_dump(mode="json"))
        self.event_index[data["id"]] = len(self.events)
        self.events.append(data)
        self.state.updated_at = data["timestamp"]
        self.files.append_event(data)
        if self.webhooks is not None:
            self.webhooks.send_event(data)
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
        self.emit(ConversationStateUpdateEvent(key="execution_status", value=status.value))
        self.changed()

    def changed(self) -> None:
        """Save the state and tell the control plane (status, title or metrics changed)."""
        self.state.updated_at = utc_now()
        self.save()
        if self.webhooks is not None:
            self.webhooks.send_info(self.info().model_dump(mode="json"))

    def save(self) -> None:
        self.files.write_meta(self.meta())

    def meta(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "request": self.request.model_dump(mode="json"),
            "state": asdict(self.state),
        }

    def info(self) -> ConversationInfo:
        s = self.state
        pending = [p.action_id for p in s.pending] if self.request.confirmation_mode else []
        return ConversationInfo(
            id=self.id,
            execution_status=s.status,
            title=s.title,
            created_at=s.created_at,
            updated_at=s.updated_at,
            max_iterations=self.request.max_iterations,
            iterations=s.iterations,
            confirmation_mode=self.request.confirmation_mode,
            metrics=Metrics(
                model_name=self.request.llm.model,
                accumulated_cost=s.accumulated_cost,
                max_budget_per_task=self.request.max_budget_per_task,
                accumulated_token_usage=TokenUsage(
                    prompt_tokens=s.prompt_tokens, completion_tokens=s.completion_tokens
                ),
            ),
            pending_action_ids=pending,
        )

    def record_completion(self, response: LLMResponse) -> None:
        """Count one LLM call: metrics, an LLMCompletionLogEvent and a conversation webhook."""
        llm = self.request.llm
        cost = response.prompt_tokens * (llm.input_cost_per_token or 0.0) + (
            response.completion_tokens * (llm.output_cost_per_token or 0.0)
        )
        s = self.state
        s.iterations += 1
        s.accumulated_cost += cost
        s.prompt_tokens += response.prompt_tokens
        s.completion_tokens += response.completion_tokens
        self.emit(
            LLMCompletionLogEvent(
                model=llm.model,
                latency_ms=response.latency_ms,
                usage={
                    "prompt_tokens": response.prompt_tokens,
                    "completion_tokens": response.completion_tokens,
                },
                cost=cost,
                accumulated_cost=s.accumulated_cost,
                response_id=response.id,
                attempts=response.attempts,
            )
        )
        self.changed()

    def stop(
        self, status: ExecutionStatus, reason: str, error: tuple[str, str] | None = None
    ) -> None:
        """End a run: optional ConversationErrorEvent, the stop_reason, then the status."""
        if error is not None:
            self.emit(ConversationErrorEvent(code=error[0], detail=error[1]))
        self.emit(ConversationStateUpdateEvent(key="stop_reason", value=reason))
        self.set_status(status)

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
