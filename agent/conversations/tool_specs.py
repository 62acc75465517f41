"""The OpenAI function specs of the built-in tools (what the model is offered).

The parameters are those of the SDK's actions (``TerminalAction``, ``FileEditorAction``,
``FinishAction``, ``ThinkAction``), so every call the model makes is a valid SDK action.
"""

from __future__ import annotations

from typing import Any

MAX_BASH_TIMEOUT = 600
TERMINAL, FILE_EDITOR, FINISH, THINK = "terminal", "file_editor", "finish", "think"
#: Our tools as SDK tool, action and observation kinds (also the server's ``usable_tools``,
#: answered without loading the conversations' code).
KINDS = {
    TERMINAL: ("TerminalTool", "TerminalAction", "TerminalObservation"),
    FILE_EDITOR: ("FileEditorTool", "FileEditorAction", "FileEditorObservation"),
    FINISH: ("FinishTool", "FinishAction", "FinishObservation"),
    THINK: ("ThinkTool", "ThinkAction", "ThinkObservation"),
}


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


FUNCTIONS: dict[str, dict[str, Any]] = {
    "terminal": _function(
        "terminal",
        "Run a bash command in the working directory and get its output and exit code. Each "
        "command runs in a fresh non-interactive shell with stdin closed (cd and exports do "
        "not carry over: chain commands with &&). Output is capped at 30000 characters per "
        "stream. Start long-running servers in the background with `&` and redirect their "
        "output to a file.",
        {
            "command": {"type": "string", "description": "The bash command to run."},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command and its children are killed "
                f"(default 60, at most {MAX_BASH_TIMEOUT}).",
            },
            "is_input": {
                "type": "boolean",
                "description": "Not supported here (stdin is closed); leave it false.",
            },
            "reset": {
                "type": "boolean",
                "description": "Not needed here: every command starts a fresh shell.",
            },
        },
        ["command"],
    ),
    "file_editor": _function(
        "file_editor",
        "View, create and edit text files. `view` shows a file with line numbers (or lists a "
        "directory two levels deep); `create` writes a new file (never overwrites); "
        "`str_replace` replaces `old_str`, which must occur exactly once, with `new_str`; "
        "`insert` adds `new_str` after line `insert_line` (0: at the top); `undo_edit` reverts "
        "the last edit of `path`. Paths are absolute or relative to the working directory.",
        {
            "command": {
                "type": "string",
                "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
            },
            "path": {"type": "string", "description": "The file or directory."},
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
    "finish": _function(
        "finish",
        "Call this when the task is complete (or cannot be completed), with a short summary "
        "of what was done for the user.",
        {"message": {"type": "string", "description": "Summary for the user."}},
        ["message"],
    ),
    "think": _function(
        "think",
        "Write down reasoning or a plan without running anything or changing any file.",
        {"thought": {"type": "string", "description": "The thought to log."}},
        ["thought"],
    ),
}
