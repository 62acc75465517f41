"""The agent loop: one LLM call per iteration, then the tool calls it asked for.

A reply without tool calls is a MessageEvent and ends the run with status ``finished`` (the
agent awaits the user, as the SDK's agent does); so does the ``finish`` tool. A run also
stops on pause (``paused``), on max_iterations, the budget, an LLM failure or an internal
error (``error``, after a ConversationErrorEvent and a ``stop_reason`` update).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
import uuid
from enum import Enum
from typing import Any

from . import events as ev
from .conversation import Conversation, Decision, PendingCall
from .failures import describe_error
from .llm import LLMError, LLMResponse
from .models import ExecutionStatus
from .secrets import resolve
from .tools import ToolArgumentsError

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """\
You are a software agent working in {working_dir} on a Linux machine.
Use the tools to inspect and change files and to run commands; do the work yourself
rather than describing it. Keep going until the task is done, then call `finish` with
a short summary. If you need something from the user, reply with a plain message."""


class _Step(Enum):
    CONTINUE = "continue"
    PAUSED = "paused"
    FINISHED = "finished"


def system_prompt(conv: Conversation) -> str:
    agent = conv.request.agent
    text = agent.system_prompt or SYSTEM_PROMPT.format(working_dir=conv.toolbox.context.working_dir)
    suffix = agent.agent_context.system_message_suffix if agent.agent_context else None
    if suffix:
        text += "\n\n" + suffix
    return text


def system_message(conv: Conversation) -> dict[str, Any]:
    return {"role": "system", "content": system_prompt(conv)}


def emit_system_prompt(conv: Conversation) -> None:
    """The SystemPromptEvent, once per conversation, when its tools are known."""
    if conv.state.system_prompt_sent:
        return
    conv.state.system_prompt_sent = True
    conv.emit(ev.system_prompt_event(system_prompt(conv), conv.toolbox.definitions()))
    conv.save()


def tool_message(tool_call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


async def run_agent(conv: Conversation) -> None:
    """Run until the agent stops; the status says why. Never raises but CancelledError."""
    conv.set_status(ExecutionStatus.RUNNING)
    try:
        if conv.mcp_started is not None:
            await asyncio.shield(conv.mcp_started)
        emit_system_prompt(conv)
        await _refresh_secrets(conv)
        await _loop(conv)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error(
            "conversation %s: internal error\n%s",
            conv.id,
            conv.masker.text(traceback.format_exc()),
        )
        conv.stop(ExecutionStatus.ERROR, "internal_error", ("InternalError", describe_error(exc)))


async def _refresh_secrets(conv: Conversation) -> None:
    """Look up the LookupSecrets again (tokens may have been renewed) for this run."""
    secrets = conv.request.secrets
    if not any(s.kind == "LookupSecret" for s in secrets.values()):
        return
    values, errors = await resolve(conv.http, secrets)
    conv.masker.add(values.values())
    conv.toolbox.context.env = values
    for error in errors:
        log.warning("conversation %s: %s", conv.id, conv.masker.text(error))
        conv.emit(ev.conversation_error_event("SecretError", error))


async def _loop(conv: Conversation) -> None:
    iterations = 0  # max_iterations applies to each run
    while True:
        if conv.state.pending:
            step = await _run_pending(conv)
            if step is _Step.PAUSED:
                conv.stop(ExecutionStatus.PAUSED, "paused")
                return
            if step is _Step.FINISHED:
                conv.stop(ExecutionStatus.FINISHED, "finished")
                return
        if conv.pause_requested:
            conv.stop(ExecutionStatus.PAUSED, "paused")
            return
        if iterations >= conv.request.max_iterations:
            detail = f"Reached the maximum of {conv.request.max_iterations} iterations."
            conv.stop(ExecutionStatus.ERROR, "max_iterations", ("MaxIterationsReached", detail))
            return
        _flush_inbox(conv)
        try:
            response = await conv.llm.complete(
                [system_message(conv), *conv.history], conv.toolbox.specs()
            )
        except LLMError as exc:
            conv.stop(ExecutionStatus.ERROR, "llm_error", ("LLMError", str(exc)))
            return
        iterations += 1
        conv.record_completion(response)
        budget = conv.request.max_budget_per_task
        if budget is not None and conv.state.accumulated_cost > budget:
            detail = (
                f"Accumulated cost ${conv.state.accumulated_cost:.6f} exceeds the budget "
                f"of ${budget:.6f}."
            )
            conv.stop(ExecutionStatus.ERROR, "budget", ("BudgetExceeded", detail))
            return
        conv.add_history(response.assistant_message())
        if not response.tool_calls:
            conv.emit(
                ev.message_event(
                    "agent", "assistant", response.content, llm_response_id=response.id
                )
            )
            if conv.state.inbox:  # the user wrote while the model was answering
                continue
            # As the SDK's agent: a reply without tool calls ends the run; it awaits the user.
            conv.set_status(ExecutionStatus.FINISHED)
            return
        _queue_actions(conv, response)


def _flush_inbox(conv: Conversation) -> None:
    if not conv.state.inbox:
        return
    for message in conv.state.inbox:
        conv.add_history(message)
    conv.state.inbox.clear()
    conv.save()


def _queue_actions(conv: Conversation, response: LLMResponse) -> None:
    thought = response.content
    response_id = response.id or f"resp-{uuid.uuid4().hex}"
    for call in response.tool_calls:
        try:
            action = conv.toolbox.check(call.name, call.arguments)
        except ToolArgumentsError as exc:
            conv.emit(
                ev.agent_error_event(tool_name=call.name, tool_call_id=call.id, error=str(exc))
            )
            conv.add_history(tool_message(call.id, f"Error: {exc}"))
            continue
        emitted = conv.emit(
            ev.action_event(
                tool_name=call.name,
                tool_call_id=call.id,
                arguments=call.arguments,
                action=action,
                thought=thought,
                llm_response_id=response_id,
            )
        )
        thought = ""  # the text goes with the first action only
        conv.state.pending.append(PendingCall(emitted["id"], call.id, call.name, action))
    conv.save()


async def _run_pending(conv: Conversation) -> _Step:
    if conv.confirms:
        decision, reason = await conv.await_confirmation()
        if decision is Decision.PAUSE:
            return _Step.PAUSED
        conv.set_status(ExecutionStatus.RUNNING)
        if decision is Decision.REJECT:
            _reject_pending(conv, reason)
            return _Step.CONTINUE
    finished = False
    while conv.state.pending:
        call = conv.state.pending[0]
        finished |= await _run_call(conv, call)
        conv.state.pending.pop(0)
        conv.save()
    return _Step.FINISHED if finished else _Step.CONTINUE


def _reject_pending(conv: Conversation, reason: str) -> None:
    for call in conv.state.pending:
        conv.emit(
            ev.user_reject_event(
                tool_name=call.tool_name,
                tool_call_id=call.tool_call_id,
                action_id=call.action_id,
                reason=reason,
            )
        )
        conv.add_history(
            tool_message(call.tool_call_id, f"The user rejected this action: {reason}")
        )
    conv.state.pending.clear()
    conv.save()


async def _run_call(conv: Conversation, call: PendingCall) -> bool:
    """Run one action; emits its observation (or error). True when it was ``finish``."""
    try:
        result = await conv.toolbox.run(call.tool_name, call.args)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = f"{call.tool_name} failed: {describe_error(exc)}"
        if not isinstance(exc, ToolArgumentsError):
            log.warning("conversation %s: %s", conv.id, conv.masker.text(error))
        conv.emit(
            ev.agent_error_event(
                tool_name=call.tool_name, tool_call_id=call.tool_call_id, error=error
            )
        )
        conv.add_history(tool_message(call.tool_call_id, f"Error: {error}"))
        return False
    conv.emit(
        ev.observation_event(
            tool_name=call.tool_name,
            tool_call_id=call.tool_call_id,
            action_id=call.action_id,
            observation=result.observation,
        )
    )
    conv.add_history(tool_message(call.tool_call_id, result.model_text))
    return result.finished
