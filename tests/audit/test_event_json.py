"""The search's and the export's JSON of an entry (audit_event.event_json, built directly for
speed) is exactly the AuditEvent model's, which the sinks send and the OpenAPI document names:
for every combination of present and absent parts, and for text a client chose (control
characters, non-ASCII, quotes)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from controlplane.store.audit_event import AuditEvent, AuditRecord, event_json, json_line

CHOICES: dict[str, tuple[Any, ...]] = {
    "user_id": (None, "bob"),
    "key_id": (None, "5d3e0c9a1b2f"),
    "org_id": (None, "eng"),
    "role": (None, "auditor"),
    "status": (None, 0, 403),
    "reason": (None, "forbidden"),
    "ip": (None, "2001:db8::1"),
    "user_agent": (None, 'curl/8 "\\x" é 名\u0001\n\t\u2028'),
    "request_id": (None, "req-1"),
}


def test_event_json_is_the_models_json() -> None:
    checked = 0
    names = list(CHOICES)
    for n, values in enumerate(itertools.product(*CHOICES.values())):
        given: dict[str, Any] = dict(zip(names, values, strict=True))
        record = AuditRecord(
            id=f"{n:020x}",
            time_ms=1764322004826 + n * 997,  # whole seconds too (n * 997 % 1000 == 0 at n=0)
            action="member.set",
            outcome="failure" if n % 2 else "success",
            via="api_key",
            admin=bool(n % 3),
            targets={"user_id": "aud"} if n % 5 else {},
            details={"role": "é"} if n % 7 else {},
            **given,
        )
        model = AuditEvent.of(record)
        assert event_json(record) == model.model_dump(mode="json"), record
        assert json_line(event_json(record)) == model.line(), record
        assert json.loads(model.line()) == event_json(record)
        checked += 1
    assert checked == 2**8 * 3
