"""The conversations of this agent server: create, restore, run, pause, confirm, delete."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import aiohttp

from ..config import AgentConfig
from ..errors import ApiError
from . import events as ev
from .conversation import Conversation, Decision, PendingCall, State
from .failures import describe_error
from .llm import LLMClient
from .loop import emit_system_prompt, run_agent, tool_message
from .masking import Masker
from .models import ExecutionStatus, SendMessageRequest, StartConversationRequest
from .persistence import META, ConversationFiles, conversations_root
from .secrets import static_values
from .tools import TOOL_ALIASES, Toolbox, ToolContext
from .webhooks import WebhookSender

log = logging.getLogger(__name__)

SHUTDOWN_FLUSH = 2.0
DELETE_FLUSH = 0.5
TITLE_LENGTH = 50


def not_found(conversation_id: str) -> ApiError:
    return ApiError(404, f"Conversation not found: {conversation_id}")


def title_from(text: str, limit: int = TITLE_LENGTH) -> str | None:
    """The first line of a message, cut to ``limit`` characters (an ellipsis when cut)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return None
    return line if len(line) <= limit else line[: max(limit - 1, 1)].rstrip() + "…"


def enabled_tools(request: StartConversationRequest) -> set[str]:
    """Our built-in tools for ``agent.tools`` + ``include_default_tools`` (others ignored)."""
    known = {TOOL_ALIASES[n] for n in request.agent.tool_names() if n in TOOL_ALIASES}
    ignored = sorted(n for n in request.agent.tool_names() if n not in TOOL_ALIASES)
    if ignored:
        log.info("tools this agent does not have are ignored: %s", ", ".join(ignored))
    return known


class ConversationService:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.conversations: dict[str, Conversation] = {}
        self._llm_session: aiohttp.ClientSession | None = None
        self._webhook_session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        # The LLM session honours HTTP(S)_PROXY; webhooks go straight to the control plane.
        self._llm_session = aiohttp.ClientSession(trust_env=True)
        self._webhook_session = aiohttp.ClientSession()
        self._restore()

    async def close(self) -> None:
        conversations = list(self.conversations.values())
        await asyncio.gather(*(self._stop(c, SHUTDOWN_FLUSH) for c in conversations))
        for conv in conversations:
            conv.files.close()
        self.conversations.clear()
        for session in (self._llm_session, self._webhook_session):
            if session is not None:
                await session.close()

    async def _stop(self, conv: Conversation, flush: float) -> None:
        """Cancel the loop, close the MCP servers and the live sockets, then the webhooks."""
        conv.closed = True
        for listener in conv.listeners:
            listener.set()
        for task in (conv.task, conv.mcp_started):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if conv.mcp is not None:
            await conv.mcp.close()
        if conv.webhooks is not None:
            await conv.webhooks.close(flush)

    # --- building ---------------------------------------------------------------

    def _working_dir(self, request: StartConversationRequest) -> Path:
        if request.workspace is None:
            return self.config.workspace
        path = Path(request.workspace.working_dir).expanduser()
        return path if path.is_absolute() else self.config.workspace / path

    def _build(
        self, conversation_id: str, request: StartConversationRequest, state: State
    ) -> Conversation:
        assert self._llm_session is not None
        assert self._webhook_session is not None
        masker = Masker([*request.secret_values(), *self.config.api_keys])
        root = conversations_root(self.config.state_dir) if self.config.state_dir else None
        files = ConversationFiles(root / conversation_id if root else None)
        working_dir = self._working_dir(request)
        working_dir.mkdir(parents=True, exist_ok=True)
        webhooks = None
        if self.config.webhook_base_url:
            key = self.config.api_keys[0] if self.config.api_keys else None
            webhooks = WebhookSender(
                self._webhook_session, self.config.webhook_base_url, conversation_id, key
            )
        servers = request.agent.mcp()
        mcp = None
        if servers:
            from .mcp_tools import MCPManager  # noqa: PLC0415 - the SDK is slow to import

            mcp = MCPManager(servers, working_dir, files.directory)
        context = ToolContext(
            working_dir=working_dir,
            env=static_values(request.secrets),
            max_output_bytes=self.config.max_output_bytes,
            post_exit_grace=self.config.post_exit_grace,
        )
        return Conversation(
            conversation_id,
            request,
            state=state,
            masker=masker,
            files=files,
            webhooks=webhooks,
            llm=LLMClient(request.agent.llm, self._llm_session, masker),
            toolbox=Toolbox(context, enabled_tools(request), mcp),
            mcp=mcp,
            http=self._webhook_session,
        )

    def _start_mcp(self, conv: Conversation) -> None:
        if conv.mcp is None or conv.mcp_started is not None:
            return
        mcp = conv.mcp

        async def start() -> None:
            try:
                errors = await mcp.start()
            except Exception as exc:  # never let MCP trouble stop the conversation
                errors = [f"MCP servers failed to start: {describe_error(exc)}"]
            for error in errors:
                log.warning("conversation %s: %s", conv.id, conv.masker.text(error))
                conv.emit(ev.conversation_error_event("MCPError", error))
            emit_system_prompt(conv)

        conv.mcp_started = asyncio.create_task(start(), name=f"mcp-start:{conv.id}")

    # --- API operations -----------------------------------------------------------

    def get(self, conversation_id: str) -> Conversation:
        conv = self.conversations.get(conversation_id)
        if conv is None:
            raise not_found(conversation_id)
        return conv

    async def create(self, request: StartConversationRequest) -> tuple[Conversation, bool]:
        """The conversation and whether it was created (False: it existed already)."""
        conversation_id = request.conversation_id or uuid.uuid4().hex
        if request.agent.mcp():
            # Import the MCP SDK (~0.4 s) off the event loop, once.
            await asyncio.to_thread(importlib.import_module, f"{__package__}.mcp_tools")
        async with self._lock:
            existing = self.conversations.get(conversation_id)
            if existing is not None:
                return existing, False
            try:
                conv = self._build(conversation_id, request, State())
            except OSError as exc:
                raise ApiError(400, f"Cannot use the workspace's working_dir: {exc}") from exc
            carried = conv.files.carried()
            if carried is not None:  # a fork: the model goes on from the source's turns
                conv.load_events(*carried)
                log.info(
                    "conversation %s goes on from %d carried messages", conv.id, len(carried[1])
                )
            self.conversations[conversation_id] = conv
        if conv.webhooks is not None:
            conv.webhooks.start()
        conv.changed()
        if conv.mcp is None:
            emit_system_prompt(conv)
        self._start_mcp(conv)
        if request.initial_message is not None:
            # The initial message always starts a run, as on the official server.
            self.send_message(conv, request.initial_message.model_copy(update={"run": True}))
        return conv, True

    def send_message(self, conv: Conversation, message: SendMessageRequest) -> None:
        """A new message makes a finished or stuck conversation ``idle`` again (as the SDK's);
        with ``run`` it starts a run unless one is going on (which sees it at its next step)."""
        text = message.text()
        if conv.status in (ExecutionStatus.FINISHED, ExecutionStatus.STUCK):
            conv.set_status(ExecutionStatus.IDLE)
        conv.emit(ev.message_event("user", message.role, text, sender=message.sender))
        conv.state.inbox.append({"role": message.role, "content": text})
        if conv.state.title is None and conv.request.autotitle and message.role == "user":
            conv.state.title = title_from(text)
            conv.changed()
        conv.save()
        if message.run and not conv.running:
            self.run(conv)

    def run(self, conv: Conversation) -> None:
        if conv.running:
            raise ApiError(409, "Conversation already running. Wait for completion or pause first.")
        conv.pause_requested = False
        self._start_mcp(conv)
        conv.set_status(ExecutionStatus.RUNNING)  # now, so a client never reads a stale status
        conv.task = asyncio.create_task(run_agent(conv), name=f"agent:{conv.id}")

    def pause(self, conv: Conversation) -> None:
        """Running: stops after the current step. Idle: paused at once. Otherwise nothing."""
        if conv.running:
            if not conv.pause_requested:
                conv.pause_requested = True
                conv.emit(ev.pause_event())
            conv.decide(Decision.PAUSE)
        elif conv.status is ExecutionStatus.IDLE:
            conv.emit(ev.pause_event())
            conv.set_status(ExecutionStatus.PAUSED)

    async def interrupt(self, conv: Conversation) -> None:
        """Stop now: the LLM call or the action in flight is cancelled; status ``paused``."""
        task = conv.task
        if task is None or task.done():
            self.pause(conv)
            return
        conv.emit(ev.pause_event())
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._interrupted(conv, "was interrupted")
        conv.stop(ExecutionStatus.PAUSED, "interrupted")

    @staticmethod
    def _interrupted(conv: Conversation, why: str) -> None:
        """Actions that may have run partly are answered with an error, never run twice."""
        for call in conv.state.pending:
            error = f"{call.tool_name} {why}"
            conv.emit(
                ev.agent_error_event(
                    tool_name=call.tool_name, tool_call_id=call.tool_call_id, error=error
                )
            )
            conv.add_history(tool_message(call.tool_call_id, f"Error: {error}"))
        conv.state.pending.clear()
        conv.save()

    def respond(self, conv: Conversation, accept: bool, reason: str) -> None:
        if not conv.decide(Decision.ACCEPT if accept else Decision.REJECT, reason):
            raise ApiError(409, "No action is waiting for confirmation")

    async def delete(self, conversation_id: str) -> None:
        async with self._lock:
            conv = self.conversations.pop(conversation_id, None)
        if conv is None:
            raise not_found(conversation_id)
        await self._stop(conv, DELETE_FLUSH)
        conv.files.remove()

    # --- restore after a restart ------------------------------------------------------

    def _restore(self) -> None:
        if self.config.state_dir is None:
            return
        root = conversations_root(self.config.state_dir)
        if not root.is_dir():
            return
        for directory in sorted(root.iterdir()):
            if not (directory / META).exists():
                continue  # a fork's carried history, whose conversation is not started yet
            try:
                self._restore_one(directory)
            except Exception as exc:
                log.error("cannot restore conversation %s: %s", directory.name, describe_error(exc))

    def _restore_one(self, directory: Path) -> None:
        meta, events, history = ConversationFiles(directory).load()
        request = StartConversationRequest.model_validate(meta["request"])
        raw: dict[str, Any] = meta["state"]
        known = {f.name for f in fields(State)}
        state = State(**{k: v for k, v in raw.items() if k in known})
        state.status = ExecutionStatus(state.status)
        state.pending = [PendingCall(**p) if isinstance(p, dict) else p for p in state.pending]
        conv = self._build(directory.name, request, state)
        conv.load_events(events, history)
        self.conversations[conv.id] = conv
        if conv.webhooks is not None:
            conv.webhooks.start()
        if state.status in (ExecutionStatus.RUNNING, ExecutionStatus.WAITING_FOR_CONFIRMATION):
            if state.status is ExecutionStatus.RUNNING:
                self._interrupted(conv, "was interrupted: the agent server restarted")
            conv.set_status(ExecutionStatus.PAUSED)
        log.info("restored conversation %s (%s)", conv.id, conv.status.value)
