"""A conversation's title from its first message, as OpenHands names conversations (its app
server asks the agent server to title one when the first user message arrives). Here the title
is that message's first line, shortened to TITLE_LENGTH characters (what our agent server's
`generate_title` answers, with no LLM call), set once, and only over the placeholder a
conversation starts with: a title the user or the start request chose is kept."""

from __future__ import annotations

from typing import Any

from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore

TITLE_LENGTH = 50


def placeholder(conversation_id: str) -> str:
    """The title a conversation starts with when its start request named none."""
    return f"Conversation {conversation_id[:5]}"


def _user_text(events: list[dict[str, Any]]) -> str | None:
    for event in events:
        if event.get("kind") != "MessageEvent" or event.get("source") != "user":
            continue
        message = event.get("llm_message") or {}
        parts = message.get("content") or []
        texts = [
            p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text"
        ]
        text = "\n".join(t for t in texts if isinstance(t, str))
        if text.strip():
            return text
    return None


def title_of(text: str) -> str:
    line = next(line.strip() for line in text.splitlines() if line.strip())
    line = " ".join(line.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


async def name_from_first_message(
    store: ConversationStore, info: AppConversationInfo, events: list[dict[str, Any]]
) -> None:
    """Title `info` from the first user message among `events`, if it still has its
    placeholder."""
    if info.title != placeholder(info.id):
        return
    text = _user_text(events)
    if text is None:
        return
    title = title_of(text)

    def change(record: AppConversationInfo) -> None:
        if record.title == placeholder(record.id):
            record.title = title

    await store.update(info.id, change)
