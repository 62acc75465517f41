"""The ``str_replace_editor`` tool: view, create, str_replace and insert.

Problems the model can fix (missing file, ``old_str`` not unique, ...) raise
:class:`EditorError`; the loop turns them into an observation with ``error`` set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

MAX_VIEW_CHARS = 30_000
SNIPPET_CONTEXT = 4
MAX_DIR_ENTRIES = 1000


class EditorError(Exception):
    """An editing request that cannot be carried out; the message is for the model."""


class EditorArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    command: Literal["view", "create", "str_replace", "insert"]
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


def _str_replace(path: Path, old: str | None, new: str | None) -> str:
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
    return _snippet(path, updated, first_line, new.count("\n") + 1)


def _insert(path: Path, insert_line: int | None, new: str | None) -> str:
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
    return _snippet(path, updated, insert_line + 1, new.count("\n") + 1)


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


def run_editor(args: EditorArgs, working_dir: Path) -> str:
    """Carry out one editor command (blocking: run it in a thread). Returns the observation."""
    path = Path(args.path).expanduser()
    if not path.is_absolute():
        path = working_dir / path
    try:
        if args.command == "view":
            return _view(path, args.view_range)
        if args.command == "create":
            return _create(path, args.file_text)
        if args.command == "str_replace":
            return _str_replace(path, args.old_str, args.new_str)
        return _insert(path, args.insert_line, args.new_str)
    except PermissionError:
        raise EditorError(f"Permission denied: {path}") from None
    except (IsADirectoryError, NotADirectoryError, FileNotFoundError) as exc:
        raise EditorError(f"{exc.strerror}: {path}") from None
