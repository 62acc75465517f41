"""The ``str_replace_editor`` tool: view, create, str_replace and insert.

Problems the model can fix (missing file, ``old_str`` not unique, ...) raise
:class:`EditorError`; the loop turns them into an observation with ``error`` set.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

MAX_VIEW_CHARS = 30_000
SNIPPET_CONTEXT = 4
MAX_DIR_ENTRIES = 1000
#: Files larger than this are edited but their contents stay out of the observation.
MAX_CONTENT_IN_OBSERVATION = 100_000
UNDO_DEPTH = 5
UNDO_MAX_BYTES = 1024 * 1024


class EditorError(Exception):
    """An editing request that cannot be carried out; the message is for the model."""


class EditorArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: list[int] | None = None


def _numbered(text: str, start: int = 1) -> str:
    lines = text.split("\n")
    if lines and lines[-1] == "" and text.endswith("\n"):
        lines.pop()
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, start))


def _cap(text: str) -> str:
    if len(text) <= MAX_VIEW_CHARS:
        return text
    cut = len(text) - MAX_VIEW_CHARS
    return text[:MAX_VIEW_CHARS] + f"\n[... {cut} more characters not shown; use view_range ...]"


def _read(path: Path) -> str:
    if not path.exists():
        raise EditorError(f"The path {path} does not exist. Please provide a valid path.")
    if path.is_dir():
        raise EditorError(f"The path {path} is a directory; this command needs a file.")
    try:
        return path.read_bytes().decode("utf-8")  # no newline translation
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not a UTF-8 text file.") from None


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))


def _view_dir(path: Path) -> str:
    entries: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        entries.extend(f"{Path(root) / d}/" for d in dirs)
        entries.extend(str(Path(root) / f) for f in sorted(files) if not f.startswith("."))
        if Path(root) != path:  # list the children of path and theirs, no deeper
            dirs[:] = []
        if len(entries) >= MAX_DIR_ENTRIES:
            entries = [*entries[:MAX_DIR_ENTRIES], "[... more entries not shown ...]"]
            break
    head = f"Here are the files and directories up to 2 levels deep in {path}, excluding hidden:"
    return "\n".join([head, *entries])


def _view(path: Path, view_range: list[int] | None) -> str:
    if path.is_dir():
        if view_range:
            raise EditorError("view_range is not allowed when path is a directory.")
        return _view_dir(path)
    text = _read(path)
    if not view_range:
        return f"Here's the result of running `cat -n` on {path}:\n" + _cap(_numbered(text))
    lines = text.split("\n")
    if len(view_range) != 2:
        raise EditorError("view_range must be a list of two integers: [start, end].")
    start, end = view_range
    if start < 1 or start > len(lines):
        raise EditorError(f"Invalid view_range start {start}: the file has {len(lines)} lines.")
    if end == -1:
        end = len(lines)
    if end < start or end > len(lines):
        raise EditorError(f"Invalid view_range end {end}: use -1 or [{start}, {len(lines)}].")
    shown = "\n".join(lines[start - 1 : end])
    return f"Here's the result of running `cat -n` on {path}:\n" + _cap(_numbered(shown, start))


def _snippet(path: Path, text: str, first_line: int, n_lines: int) -> str:
    lines = text.split("\n")
    start = max(1, first_line - SNIPPET_CONTEXT)
    end = min(len(lines), first_line + n_lines + SNIPPET_CONTEXT)
    shown = _numbered("\n".join(lines[start - 1 : end]), start)
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet "
        f"of {path}:\n{_cap(shown)}\nReview the changes and make sure they are as expected."
    )


@dataclass
class EditResult:
    """What an editor command did: the text for the model and the file before and after."""

    text: str
    path: Path
    prev_exist: bool = True
    old_content: str | None = None
    new_content: str | None = None


@dataclass
class UndoHistory:
    """Earlier contents of edited files (a few per file, small files only), for ``undo_edit``."""

    saved: dict[Path, deque[str | None]] = field(default_factory=dict)

    def remember(self, path: Path, content: str | None) -> None:
        if content is not None and len(content) > UNDO_MAX_BYTES:
            self.saved.pop(path, None)  # too big to keep: an undo must not restore an older one
            return
        self.saved.setdefault(path, deque(maxlen=UNDO_DEPTH)).append(content)

    def undo(self, path: Path) -> tuple[str, str | None, str | None]:
        stack = self.saved.get(path)
        if not stack:
            raise EditorError(f"No edit history found for {path}.")
        previous = stack.pop()
        current = path.read_bytes().decode("utf-8") if path.exists() else None
        if previous is None:
            path.unlink(missing_ok=True)
            return f"Last edit to {path} undone: the file was removed.", current, None
        _write(path, previous)
        return (
            f"Last edit to {path} undone successfully. {_snippet_text(path, previous)}",
            current,
            previous,
        )


def _snippet_text(path: Path, text: str) -> str:
    return f"Here's the result of running `cat -n` on {path}:\n" + _cap(_numbered(text))


def _str_replace(path: Path, old: str | None, new: str | None) -> tuple[str, str, str]:
    if not old:
        raise EditorError("Parameter `old_str` is required (and non-empty) for str_replace.")
    new = new or ""
    if old == new:
        raise EditorError("No replacement was performed: `new_str` and `old_str` are the same.")
    text = _read(path)
    count = text.count(old)
    if count == 0:
        raise EditorError(
            f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
        )
    if count > 1:
        lines: list[int] = []
        pos = text.find(old)
        while pos != -1:
            lines.append(text.count("\n", 0, pos) + 1)
            pos = text.find(old, pos + 1)
        raise EditorError(
            f"No replacement was performed: old_str `{old}` occurs {count} times in {path} "
            f"(lines {', '.join(map(str, lines))}); it must occur exactly once. "
            "Include more surrounding lines to make it unique."
        )
    first_line = text[: text.find(old)].count("\n") + 1
    updated = text.replace(old, new, 1)
    _write(path, updated)
    return _snippet(path, updated, first_line, new.count("\n") + 1), text, updated


def _insert(path: Path, insert_line: int | None, new: str | None) -> tuple[str, str, str]:
    if insert_line is None or new is None:
        raise EditorError("Parameters `insert_line` and `new_str` are required for insert.")
    text = _read(path)
    lines = text.splitlines(keepends=True)
    if insert_line < 0 or insert_line > len(lines):
        raise EditorError(
            f"Invalid insert_line {insert_line}: it must be in [0, {len(lines)}] "
            "(0 inserts before the first line)."
        )
    if insert_line == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(insert_line, new if new.endswith("\n") else new + "\n")
    updated = "".join(lines)
    _write(path, updated)
    return _snippet(path, updated, insert_line + 1, new.count("\n") + 1), text, updated


def _create(path: Path, file_text: str | None) -> str:
    if file_text is None:
        raise EditorError("Parameter `file_text` is required for create.")
    if path.exists():
        raise EditorError(
            f"File already exists at: {path}. Cannot overwrite files using command `create`."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, file_text)
    return f"File created successfully at: {path}"


def _bounded(content: str | None) -> str | None:
    return content if content is None or len(content) <= MAX_CONTENT_IN_OBSERVATION else None


def run_editor(args: EditorArgs, working_dir: Path, undo: UndoHistory | None = None) -> EditResult:
    """Carry out one editor command (blocking: run it in a thread).

    Raises EditorError with a message for the model when the command cannot be carried out.
    """
    path = Path(args.path).expanduser()
    if not path.is_absolute():
        path = working_dir / path
    try:
        if args.command == "view":
            return EditResult(_view(path, args.view_range), path)
        if args.command == "undo_edit":
            if undo is None:
                raise EditorError("undo_edit is not available here.")
            message, before, after = undo.undo(path)
            return EditResult(message, path, True, _bounded(before), _bounded(after))
        if args.command == "create":
            message = _create(path, args.file_text)
            if undo is not None:
                undo.remember(path, None)
            return EditResult(message, path, False, None, _bounded(args.file_text))
        if args.command == "str_replace":
            message, before, after = _str_replace(path, args.old_str, args.new_str)
        else:
            message, before, after = _insert(path, args.insert_line, args.new_str)
        if undo is not None:
            undo.remember(path, before)
        return EditResult(message, path, True, _bounded(before), _bounded(after))
    except PermissionError:
        raise EditorError(f"Permission denied: {path}") from None
    except (IsADirectoryError, NotADirectoryError, FileNotFoundError) as exc:
        raise EditorError(f"{exc.strerror}: {path}") from None
