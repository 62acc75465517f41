"""History as the classic OpenHands web frontend reads it: GET /api/v1/conversation/{id}/events/
search (the singular path; only web frontends use it) answers the terminal's events under the
names frontend 0.62 knows, `ExecuteBashAction` and `ExecuteBashObservation` with an `output`
string (its `src/types/v1/core/base/{action,observation}.ts`), where the SDK says
`TerminalAction` / `TerminalObservation` with `content[]`. Events are stored and served as the
agent sent them everywhere else (the SDK no longer knows the old names); `content` is kept, so
Agent Canvas, which reads both, sees no difference. The agent server does the same for browser
sockets (agent/conversations/legacy_names.py).

The finish observation keeps its name, but that frontend reads its text from `message`
(`FinishObservation.message`), which the SDK folded into `content[]` as well: it is added here,
or the agent's final answer opens on nothing in a reopened conversation."""

from __future__ import annotations

from typing import Any

_OLD_KINDS = {
    "TerminalAction": "ExecuteBashAction",
    "TerminalObservation": "ExecuteBashObservation",
}
_PAYLOAD = {"ActionEvent": "action", "ObservationEvent": "observation"}


def _text_of(observation: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for part in observation.get("content") or []
        if isinstance(part, dict) and part.get("type") == "text"
    )


#: The observation fields frontend 0.62 reads as one string, the text of `content[]` today.
_TEXT_FIELDS = {"ExecuteBashObservation": "output", "FinishObservation": "message"}


def with_old_terminal_names(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        field = _PAYLOAD.get(str(event.get("kind")))
        payload = event.get(field) if field is not None else None
        if field is None or not isinstance(payload, dict):
            out.append(event)
            continue
        kind = _OLD_KINDS.get(str(payload.get("kind")), payload.get("kind"))
        text_field = _TEXT_FIELDS.get(str(kind)) if field == "observation" else None
        if kind == payload.get("kind") and (text_field is None or text_field in payload):
            out.append(event)
            continue
        renamed = {**payload, "kind": kind}
        if text_field is not None and text_field not in payload:
            renamed[text_field] = _text_of(payload)
        out.append({**event, field: renamed})
    return out
