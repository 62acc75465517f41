"""Tools offered to the model: execute_bash, str_replace_editor, finish, plus MCP tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..shell import run_command
from .editor import EditorArgs, EditorError, run_editor

if TYPE_CHECKING:
    from .mcp_tools import MCPManager

MAX_STREAM_CHARS = 30_000
MAX_BASH_TIMEOUT = 600
FINISH = "finish"

ModelT = TypeVar("ModelT", bound=BaseModel)


class ToolArgumentsError(Exception):
    """The call cannot run: unknown tool or arguments that do not fit (an AgentErrorEvent)."""


@dataclass
class ToolResult:
    observation: dict[str, Any]
    finished: bool = False

    @property
    def content(self) -> str:
        return str(self.observation.get("content", ""))


@dataclass
class ToolContext:
    working_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    max_output_bytes: int = 1024 * 1024
    post_exit_grace: float = 1.0


class BashArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    command: str
    timeout: int = 60


class FinishArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    message: str = ""


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


BUILTIN_SPECS: list[dict[str, Any]] = [
    _function(
        "execute_bash",
        "Run a bash command in the working directory (non-interactive, stdin closed) and "
        f"return its output (at most {MAX_STREAM_CHARS} characters per stream) and exit code. "
        "Background long-running servers with `&` and redirect their output to a file.",
        {
            "command": {"type": "string", "description": "The bash command to run."},
            "timeout": {
                "type": "integer",
                "description": f"Seconds before the command is killed (default 60, max "
                f"{MAX_BASH_TIMEOUT}).",
            },
        },
        ["command"],
    ),
    _function(
        "str_replace_editor",
        "View, create and edit files. `view` shows a file with line numbers (or a directory "
        "two levels deep); `create` writes a new file; `str_replace` replaces `old_str`, which "
        "must occur exactly once, by `new_str`; `insert` adds `new_str` after line "
        "`insert_line` (0: at the top). Paths are absolute or relative to the working dir.",
        {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"},
            "file_text": {"type": "string", "description": "Content of the file (create)."},
            "old_str": {"type": "string", "description": "Exact text to replace (str_replace)."},
            "new_str": {"type": "string", "description": "Replacement or inserted text."},
            "insert_line": {"type": "integer", "description": "Line to insert after (insert)."},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "[start, end] lines to view, 1-based; end -1 means to the end.",
            },
        },
        ["command", "path"],
    ),
    _function(
        FINISH,
        "Call this when the task is complete, with a short summary for the user.",
        {"message": {"type": "string", "description": "Summary of what was done."}},
        ["message"],
    ),
]
BUILTIN_NAMES = {spec["function"]["name"] for spec in BUILTIN_SPECS}


def cap_stream(text: str, limit: int = MAX_STREAM_CHARS) -> tuple[str, bool]:
    """Keep the head and the tail of ``text`` (``limit`` characters in all)."""
    if len(text) <= limit:
        return text, False
    head, tail = text[: limit // 2], text[len(text) - limit // 2 :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}", True


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


class Toolbox:
    """The tools of one conversation."""

    def __init__(self, context: ToolContext, mcp: MCPManager | None = None) -> None:
        self.context = context
        self.mcp = mcp

    def specs(self) -> list[dict[str, Any]]:
        extra = self.mcp.specs(BUILTIN_NAMES) if self.mcp else []
        return [*BUILTIN_SPECS, *extra]

    def knows(self, name: str) -> bool:
        return name in BUILTIN_NAMES or (self.mcp is not None and self.mcp.has(name))

    def check(self, name: str, arguments: str) -> dict[str, Any]:
        """Parse and check a call before it becomes an action; ToolArgumentsError if it can't."""
        if not self.knows(name):
            raise ToolArgumentsError(f"unknown tool {name!r}; the tools are: {self.names()}")
        args = parse_arguments(arguments)
        if name == "execute_bash":
            _validate(BashArgs, name, args)
        elif name == "str_replace_editor":
            _validate(EditorArgs, name, args)
        elif name == FINISH:
            _validate(FinishArgs, name, args)
        return args

    def names(self) -> str:
        return ", ".join(spec["function"]["name"] for spec in self.specs())

    async def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Run a checked call. Tool failures raise; problems the model can fix are results."""
        if name == "execute_bash":
            return await self._bash(_validate(BashArgs, name, args))
        if name == "str_replace_editor":
            return await self._editor(_validate(EditorArgs, name, args))
        if name == FINISH:
            message = _validate(FinishArgs, name, args).message
            return ToolResult({"content": message}, finished=True)
        if self.mcp is not None and self.mcp.has(name):
            text, is_error = await self.mcp.call(name, args)
            return ToolResult({"content": text, "error": text} if is_error else {"content": text})
        raise ToolArgumentsError(f"unknown tool {name!r}")

    async def _bash(self, args: BashArgs) -> ToolResult:
        timeout = min(max(args.timeout, 1), MAX_BASH_TIMEOUT)
        result = await run_command(
            args.command,
            self.context.working_dir,
            timeout,
            max_output_bytes=self.context.max_output_bytes,
            post_exit_grace=self.context.post_exit_grace,
            extra_env=self.context.env,
        )
        stdout, cut_out = cap_stream(result.stdout)
        stderr, cut_err = cap_stream(result.stderr)
        parts = [stdout] if stdout else []
        if stderr:
            parts.append(f"[stderr]\n{stderr}")
        if result.truncated:
            parts.append("[output beyond 1 MiB per stream was discarded]")
        if result.timed_out:
            parts.append(f"[Command timed out after {timeout} s; its processes were killed]")
        else:
            parts.append(f"[Command finished with exit code {result.exit_code}]")
        content = "\n".join(p.rstrip("\n") for p in parts)
        return ToolResult(
            {
                "content": content,
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "truncated": result.truncated or cut_out or cut_err,
            }
        )

    async def _editor(self, args: EditorArgs) -> ToolResult:
        try:
            text = await asyncio.to_thread(run_editor, args, self.context.working_dir)
        except EditorError as exc:
            return ToolResult({"content": str(exc), "error": str(exc)})
        return ToolResult({"content": text})
