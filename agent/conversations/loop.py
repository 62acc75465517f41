"""The agent loop: one LLM call per iteration, then the tool calls it asked for.

A reply without tool calls is a MessageEvent and the run ends with status ``idle``
(the agent waits for the user); the ``finish`` tool ends it with ``finished``. A run also
stops on pause (``paused``), on max_iterations, the budget, an LLM failure or an internal
error (``error``, after a ConversationErrorEvent and a ``stop_reason`` update).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from enum import Enum
from typing import Any

from .conversation import Conversation, Decision, PendingCall
from .events import (
    ActionEvent,
    AgentErrorEvent,
    MessageEvent,
    ObservationEvent,
    UserRejectObservation,
    text_message,
)
from .failures import describe_error
from .llm import LLMError, LLMResponse
from .models import ExecutionStatus
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


def system_message(conv: Conversation) -> dict[str, Any]:
    text = SYSTEM_PROMPT.format(working_dir=conv.toolbox.context.working_dir)
    if conv.request.system_message_suffix:
        text += "\n\n" + conv.request.system_message_suffix
    return {"role": "system", "content": text}


def tool_message(tool_call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


async def run_agent(conv: Conversation) -> None:
    """Run until the agent stops; the status says why. Never raises but CancelledError."""
    conv.set_status(ExecutionStatus.RUNNING)
    try:
        if conv.mcp_started is not None:
            await asyncio.shield(conv.mcp_started)
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
            reply = text_message("assistant", response.content)
            conv.emit(MessageEvent(source="agent", llm_message=reply))
            if conv.state.inbox:  # the user wrote while the model was answering
                continue
            conv.set_status(ExecutionStatus.IDLE)
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
    for call in response.tool_calls:
        try:
            args = conv.toolbox.check(call.name, call.arguments)
        except ToolArgumentsError as exc:
            conv.emit(AgentErrorEvent(tool_name=call.name, tool_call_id=call.id, error=str(exc)))
            conv.add_history(tool_message(call.id, f"Error: {exc}"))
            continue
        action = conv.emit(
            ActionEvent(
                tool_name=call.name,
                tool_call_id=call.id,
                action=args,
                thought=thought,
                llm_response_id=response.id,
            )
        )
        thought = ""  # the text goes with the first action only
        conv.state.pending.append(PendingCall(action["id"], call.id, call.name, args))
    conv.save()


async def _run_pending(conv: Conversation) -> _Step:
    if conv.request.confirmation_mode:
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
            UserRejectObservation(
                tool_name=call.tool_name,
                tool_call_id=call.tool_call_id,
                action_id=call.action_id,
                rejection_reason=reason,
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
            AgentErrorEvent(tool_name=call.tool_name, tool_call_id=call.tool_call_id, error=error)
        )
        conv.add_history(tool_message(call.tool_call_id, f"Error: {error}"))
        return False
    conv.emit(
        ObservationEvent(
            tool_name=call.tool_name,
            tool_call_id=call.tool_call_id,
            action_id=call.action_id,
            observation=result.observation,
        )
    )
    conv.add_history(tool_message(call.tool_call_id, result.content))
    return result.finished
