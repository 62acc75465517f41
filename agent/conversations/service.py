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
from .conversation import Conversation, Decision, PendingCall, State
from .events import AgentErrorEvent, ConversationErrorEvent, MessageEvent, text_message
from .failures import describe_error
from .llm import LLMClient
from .loop import run_agent, tool_message
from .masking import Masker
from .models import ExecutionStatus, SendMessageRequest, StartConversationRequest
from .persistence import ConversationFiles, conversations_root
from .tools import Toolbox, ToolContext
from .webhooks import WebhookSender

log = logging.getLogger(__name__)

SHUTDOWN_FLUSH = 2.0
DELETE_FLUSH = 0.5


def not_found(conversation_id: str) -> ApiError:
    return ApiError(404, f"Conversation not found: {conversation_id}")


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
        """Cancel the loop, close the MCP servers, then the webhook sender."""
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
        if not request.working_dir:
            return self.config.workspace
        path = Path(request.working_dir).expanduser()
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
        servers = request.mcp_config
        has_mcp = servers.stdio_servers or servers.sse_servers or servers.shttp_servers
        mcp = None
        if has_mcp:
            from .mcp_tools import MCPManager  # noqa: PLC0415 - the SDK is slow to import

            mcp = MCPManager(servers, working_dir, files.directory)
        context = ToolContext(
            working_dir=working_dir,
            env=dict(request.secrets),
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
            llm=LLMClient(request.llm, self._llm_session, masker),
            toolbox=Toolbox(context, mcp),
            mcp=mcp,
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
                conv.emit(ConversationErrorEvent(code="MCPError", detail=error))

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
        servers = request.mcp_config
        if servers.stdio_servers or servers.sse_servers or servers.shttp_servers:
            # Import the MCP SDK (~0.4 s) off the event loop, once.
            await asyncio.to_thread(importlib.import_module, f"{__package__}.mcp_tools")
        async with self._lock:
            existing = self.conversations.get(conversation_id)
            if existing is not None:
                return existing, False
            try:
                conv = self._build(conversation_id, request, State())
            except OSError as exc:
                raise ApiError(400, f"Cannot use working_dir: {exc}") from exc
            self.conversations[conversation_id] = conv
        if conv.webhooks is not None:
            conv.webhooks.start()
        conv.changed()
        self._start_mcp(conv)
        if request.initial_message is not None:
            self.send_message(conv, request.initial_message)
        return conv, True

    def send_message(self, conv: Conversation, message: SendMessageRequest) -> None:
        text = message.text()
        conv.emit(MessageEvent(source="user", llm_message=text_message(message.role, text)))
        conv.state.inbox.append({"role": message.role, "content": text})
        conv.save()
        if message.run and not conv.running:
            self.run(conv)

    def run(self, conv: Conversation) -> None:
        if conv.running:
            raise ApiError(409, "Conversation is already running")
        conv.pause_requested = False
        self._start_mcp(conv)
        conv.set_status(ExecutionStatus.RUNNING)  # now, so a client never reads a stale status
        conv.task = asyncio.create_task(run_agent(conv), name=f"agent:{conv.id}")

    def pause(self, conv: Conversation) -> None:
        if conv.running:
            conv.pause_requested = True
            conv.decide(Decision.PAUSE)

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
                # The action may have run partly: do not run it twice.
                for call in state.pending:
                    error = f"{call.tool_name} was interrupted: the agent server restarted"
                    conv.emit(
                        AgentErrorEvent(
                            tool_name=call.tool_name, tool_call_id=call.tool_call_id, error=error
                        )
                    )
                    conv.add_history(tool_message(call.tool_call_id, f"Error: {error}"))
                state.pending.clear()
            conv.set_status(ExecutionStatus.PAUSED)
        log.info("restored conversation %s (%s)", conv.id, conv.status.value)
