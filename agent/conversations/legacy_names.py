"""The terminal's events under the names the classic OpenHands web frontend knows (frontend
0.62: `ExecuteBashAction`, `ExecuteBashObservation` with an `output` string, in
`src/types/v1/core/base/{action,observation}.ts`), for the sockets of browsers.

The SDK renamed them `TerminalAction` / `TerminalObservation` (output in `content[]`) and no
longer knows the old names, so they are never stored nor sent to SDK clients: a socket whose
handshake carries an `Origin` (every browser's does; the SDK's websocket client sends none)
gets the old names, with `content` kept and `output` added. Agent Canvas reads both.
"""

from __future__ import annotations

from typing import Any

RENAMED = {"TerminalAction": "ExecuteBashAction", "TerminalObservation": "ExecuteBashObservation"}


def for_browsers(event: dict[str, Any]) -> dict[str, Any]:
    """`event` with a terminal action or observation under its old name; any other unchanged."""
    field = {"ActionEvent": "action", "ObservationEvent": "observation"}.get(event.get("kind", ""))
    inner = event.get(field) if field else None
    if field is None or not isinstance(inner, dict) or inner.get("kind") not in RENAMED:
        return event
    renamed = dict(inner, kind=RENAMED[inner["kind"]])
    if field == "observation":
        parts = inner.get("content") or []
        renamed["output"] = "".join(
            p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text"
        )
    return {**event, field: renamed}
