"""On-disk state of a conversation: ``<state dir>/conversations/<id>/``.

``meta.json`` (the start request, secrets included, and the mutable state; mode 0600),
``events.jsonl`` (the masked events, one per line) and ``history.jsonl`` (the messages
sent to the LLM, masked). The directory is outside the workspace. A fork of a conversation
finds the events and history of the conversation it was forked from there (no meta.json),
and goes on from them. A write error
disables persistence for that conversation with one log line; it never stops the agent.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

META = "meta.json"
EVENTS = "events.jsonl"
HISTORY = "history.jsonl"


def conversations_root(state_dir: Path) -> Path:
    return state_dir / "conversations"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if not path.exists():
        return items
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash
                log.warning("skipping a damaged line in %s", path)
    return items


class ConversationFiles:
    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._handles: dict[str, IO[str]] = {}
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                self._fail(exc)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def _fail(self, exc: OSError) -> None:
        log.error("persistence disabled for %s: %s", self.directory, exc)
        self.close()
        self.directory = None

    def _append(self, name: str, item: dict[str, Any]) -> None:
        if self.directory is None:
            return
        try:
            handle = self._handles.get(name)
            if handle is None:
                fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                handle = self._handles[name] = os.fdopen(fd, "a", encoding="utf-8")
            handle.write(json.dumps(item, separators=(",", ":")) + "\n")
            handle.flush()
        except OSError as exc:
            self._fail(exc)

    def append_event(self, event: dict[str, Any]) -> None:
        self._append(EVENTS, event)

    def append_history(self, message: dict[str, Any]) -> None:
        self._append(HISTORY, message)

    def write_meta(self, meta: dict[str, Any]) -> None:
        if self.directory is None:
            return
        tmp = self.directory / f".{META}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(meta, handle)
            os.replace(tmp, self.directory / META)
        except OSError as exc:
            self._fail(exc)

    def load(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """(meta, events, history) of a stored conversation; OSError/ValueError if unreadable."""
        assert self.directory is not None
        meta = json.loads((self.directory / META).read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("meta.json is not an object")
        return meta, _read_jsonl(self.directory / EVENTS), _read_jsonl(self.directory / HISTORY)

    def carried(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """(events, history) a fork left in a new conversation's directory: the control plane
        restores them there, under the new id, from a checkpoint of another conversation
        (docs/sandboxes.md#checkpoints), without ``meta.json`` (the source's credentials).
        None when the directory holds no such thing."""
        if self.directory is None or (self.directory / META).exists():
            return None
        events = _read_jsonl(self.directory / EVENTS)
        history = _read_jsonl(self.directory / HISTORY)
        return (events, history) if events or history else None

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def remove(self) -> None:
        self.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
