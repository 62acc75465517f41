"""The terminal's events under the names the classic OpenHands web frontend knows (frontend
0.62: `ExecuteBashAction`, `ExecuteBashObservation` with an `output` string, in
`src/types/v1/core/base/{action,observation}.ts`), for the sockets of browsers.

The SDK renamed them `TerminalAction` / `TerminalObservation` (output in `content[]`) and no
longer knows the old names, so they are never stored nor sent to SDK clients: a socket whose
handshake carries an `Origin` (every browser's does; the SDK's websocket client sends none)
gets the old names, with `content` kept and `output` added. Agent Canvas reads both.

The finish observation keeps its name, but that frontend reads its text from a `message` field
(`FinishObservation.message`, `components/v1/chat/event-content-helpers/get-observation-content.ts`)
that the SDK folded into `content[]` too: browsers get `message` added, or the agent's final
answer opens on nothing in a reopened conversation.
"""

from __future__ import annotations

from typing import Any

RENAMED = {"TerminalAction": "ExecuteBashAction", "TerminalObservation": "ExecuteBashObservation"}
#: The observation fields that frontend reads as one string, the text of `content[]` today.
TEXT_FIELDS = {"ExecuteBashObservation": "output", "FinishObservation": "message"}


def _text(parts: Any) -> str:
    return "".join(
        p.get("text", "") for p in parts or [] if isinstance(p, dict) and p.get("type") == "text"
    )


def for_browsers(event: dict[str, Any]) -> dict[str, Any]:
    """`event` with a terminal action or observation under its old name and the text fields
    that frontend reads; any other event unchanged."""
    field = {"ActionEvent": "action", "ObservationEvent": "observation"}.get(event.get("kind", ""))
    inner = event.get(field) if field else None
    if field is None or not isinstance(inner, dict):
        return event
    kind = RENAMED.get(inner.get("kind", ""), inner.get("kind"))
    text_field = TEXT_FIELDS.get(str(kind)) if field == "observation" else None
    if kind == inner.get("kind") and (text_field is None or text_field in inner):
        return event
    renamed = dict(inner, kind=kind)
    if text_field is not None and text_field not in inner:
        renamed[text_field] = _text(inner.get("content"))
    return {**event, field: renamed}
