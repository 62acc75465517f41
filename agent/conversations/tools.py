"""Tools offered to the model, as the SDK names them: ``terminal``, ``file_editor``, ``finish``,
``think``, plus MCP tools. Each call becomes an SDK ``Action`` dump (``TerminalAction``, ...)
and its result an SDK ``Observation`` dump (``TerminalObservation``, ...).

Which built-in tools a conversation has follows ``agent.tools`` (``TerminalTool``,
``FileEditorTool``) and ``agent.include_default_tools`` (``FinishTool``, ``ThinkTool``).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..shell import run_command
from . import tool_specs
from .editor import EditorArgs, EditorError, UndoHistory, run_editor
from .events import text, tool_definition
from .tool_specs import FILE_EDITOR, FINISH, KINDS, TERMINAL, THINK

if TYPE_CHECKING:
    from .mcp_tools import MCPManager

MAX_STREAM_CHARS = 30_000
MAX_BASH_TIMEOUT = 600
DEFAULT_BASH_TIMEOUT = 60

#: ``agent.tools`` names (SDK class names, and the tool names themselves) -> our tool.
TOOL_ALIASES = {
    "TerminalTool": TERMINAL,
    "BashTool": TERMINAL,
    TERMINAL: TERMINAL,
    "FileEditorTool": FILE_EDITOR,
    FILE_EDITOR: FILE_EDITOR,
    "FinishTool": FINISH,
    FINISH: FINISH,
    "ThinkTool": THINK,
    THINK: THINK,
}

ModelT = TypeVar("ModelT", bound=BaseModel)


class ToolArgumentsError(Exception):
    """The call cannot run: unknown tool or arguments that do not fit (an AgentErrorEvent)."""


@dataclass
class ToolResult:
    """An SDK Observation dump, the text the model gets back, and whether the task ended."""

    observation: dict[str, Any]
    model_text: str
    finished: bool = False


@dataclass
class ToolContext:
    working_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    max_output_bytes: int = 1024 * 1024
    post_exit_grace: float = 1.0


class TerminalArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    command: str
    is_input: bool = False
    timeout: float | None = Field(default=None, ge=0)
    reset: bool = False


class FinishArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    message: str = ""


class ThinkArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    thought: str = ""


def cap_stream(value: str, limit: int = MAX_STREAM_CHARS) -> tuple[str, bool]:
    """Keep the head and the tail of ``value`` (``limit`` characters in all)."""
    if len(value) <= limit:
        return value, False
    head, tail = value[: limit // 2], value[len(value) - limit // 2 :]
    return f"{head}\n[... {len(value) - len(head) - len(tail)} characters cut ...]\n{tail}", True


def parse_arguments(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolArgumentsError(f"the arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ToolArgumentsError("the arguments must be a JSON object")
    return value


def _validate(model: type[ModelT], name: str, args: dict[str, Any]) -> ModelT:
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        raise ToolArgumentsError(f"invalid arguments for {name}: {problems}") from None


def _dump(kind: str, model: BaseModel) -> dict[str, Any]:
    return {"kind": kind, **model.model_dump(exclude_none=True)}


def _observation(kind: str, content: str, is_error: bool = False, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "content": [text(content)], "is_error": is_error, **extra}


def _error_text(message: str) -> str:
    return f"[An error occurred during execution.]\n{message}"


class Toolbox:
    """The tools of one conversation."""

    def __init__(
        self, context: ToolContext, enabled: set[str], mcp: MCPManager | None = None
    ) -> None:
        self.context = context
        self.builtin = [name for name in KINDS if name in enabled]
        self.mcp = mcp
        self.undo = UndoHistory()

    def specs(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` of every call."""
        builtin = [tool_specs.FUNCTIONS[name] for name in self.builtin]
        extra = self.mcp.specs(set(self.builtin)) if self.mcp else []
        return [*builtin, *extra]

    def definitions(self) -> list[dict[str, Any]]:
        """The SDK ``ToolDefinition`` dumps of a SystemPromptEvent."""
        out = []
        for name in self.builtin:
            kind, action, observation = KINDS[name]
            description = tool_specs.FUNCTIONS[name]["function"]["description"]
            out.append(tool_definition(kind, name, description, action, observation))
        if self.mcp is not None:
            out.extend(self.mcp.definitions(set(self.builtin)))
        return out

    def knows(self, name: str) -> bool:
        return name in self.builtin or (self.mcp is not None and self.mcp.has(name))

    def names(self) -> str:
        return ", ".join(spec["function"]["name"] for spec in self.specs())

    def check(self, name: str, arguments: str) -> dict[str, Any]:
        """The SDK Action dump of a call; ToolArgumentsError when it cannot become an action."""
        if not self.knows(name):
            raise ToolArgumentsError(f"unknown tool {name!r}; the tools are: {self.names()}")
        args = parse_arguments(arguments)
        if name == TERMINAL:
            return _dump("TerminalAction", _validate(TerminalArgs, name, args))
        if name == FILE_EDITOR:
            return _dump("FileEditorAction", _validate(EditorArgs, name, args))
        if name == FINISH:
            return _dump("FinishAction", _validate(FinishArgs, name, args))
        if name == THINK:
            return _dump("ThinkAction", _validate(ThinkArgs, name, args))
        return {"kind": "MCPToolAction", "data": args}

    async def run(self, name: str, action: dict[str, Any]) -> ToolResult:
        """Run a checked action. Tool failures raise; problems the model can fix are results."""
        args = {k: v for k, v in action.items() if k != "kind"}
        if name == TERMINAL:
            return await self._terminal(_validate(TerminalArgs, name, args))
        if name == FILE_EDITOR:
            return await self._editor(_validate(EditorArgs, name, args))
        if name == FINISH:
            message = _validate(FinishArgs, name, args).message
            return ToolResult(_observation("FinishObservation", message), message, finished=True)
        if name == THINK:
            logged = "Your thought has been logged."
            return ToolResult(_observation("ThinkObservation", logged), logged)
        if self.mcp is not None and self.mcp.has(name):
            output, is_error = await self.mcp.call(name, action.get("data") or {})
            observation = _observation(
                "MCPToolObservation", output, is_error=is_error, tool_name=name
            )
            return ToolResult(observation, _error_text(output) if is_error else output)
        raise ToolArgumentsError(f"unknown tool {name!r}")

    def _terminal_failure(self, command: str, message: str) -> ToolResult:
        observation = _observation(
            "TerminalObservation", message, is_error=True, command=command, exit_code=None
        )
        return ToolResult(observation, _error_text(message))

    async def _terminal(self, args: TerminalArgs) -> ToolResult:
        if args.is_input:
            return self._terminal_failure(
                args.command,
                "is_input is not supported: every command runs in a fresh non-interactive "
                "shell with stdin closed.",
            )
        if not args.command.strip():
            note = "Nothing to run: give a command (each runs in a fresh shell)."
            if args.reset:
                note = "The terminal was reset: each command runs in a fresh shell anyway."
            return self._terminal_failure(args.command, note)
        limit = DEFAULT_BASH_TIMEOUT if not args.timeout else args.timeout
        limit = min(max(limit, 1), MAX_BASH_TIMEOUT)
        result = await run_command(
            args.command,
            self.context.working_dir,
            limit,
            max_output_bytes=self.context.max_output_bytes,
            post_exit_grace=self.context.post_exit_grace,
            extra_env=self.context.env,
        )
        stdout, _ = cap_stream(result.stdout)
        stderr, _ = cap_stream(result.stderr)
        parts = [stdout] if stdout else []
        if stderr:
            parts.append(f"[stderr]\n{stderr}")
        if result.truncated:
            parts.append("[output beyond 1 MiB per stream was discarded]")
        if result.timed_out:
            parts.append(f"[Command timed out after {limit:g} s; its processes were killed]")
        output = "\n".join(p.rstrip("\n") for p in parts)
        exit_code = -1 if result.timed_out else result.exit_code
        metadata = {
            "exit_code": exit_code,
            "pid": -1,
            "username": _USER,
            "hostname": _HOST,
            "working_dir": str(self.context.working_dir),
            "prefix": "",
            "suffix": "",
        }
        observation = _observation(
            "TerminalObservation",
            output,
            command=args.command,
            exit_code=None if result.timed_out else exit_code,
            timeout=result.timed_out,
            metadata=metadata,
        )
        model_text = output
        if not result.timed_out:
            model_text = f"{output}\n[Command finished with exit code {exit_code}]".lstrip("\n")
        return ToolResult(observation, model_text)

    async def _editor(self, args: EditorArgs) -> ToolResult:
        try:
            done = await asyncio.to_thread(run_editor, args, self.context.working_dir, self.undo)
        except EditorError as exc:
            observation = _observation(
                "FileEditorObservation",
                str(exc),
                is_error=True,
                command=args.command,
                path=args.path,
            )
            return ToolResult(observation, _error_text(str(exc)))
        observation = _observation(
            "FileEditorObservation",
            done.text,
            command=args.command,
            path=str(done.path),
            prev_exist=done.prev_exist,
            old_content=done.old_content,
            new_content=done.new_content,
        )
        return ToolResult(observation, done.text)


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


_USER = _user()
_HOST = socket.gethostname()
