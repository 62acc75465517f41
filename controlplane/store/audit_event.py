"""One audit entry: as the control plane holds it (AuditRecord), as Redis stores it (flat stream
fields, named once per stream node by Redis so they cost nothing per entry), and as everyone
reads it (AuditEvent: the API, the JSON-lines export and every sink, in the Elastic Common
Schema's names, which SIEMs ingest as they are).

No field is free text from the entry's action: ids, an action, an outcome, a status, an error
*code* (never its message, which may repeat what a client sent), the address and the user agent
(redacted of anything shaped like a secret, controlplane/store/audit.py) and named details
(field names, roles; never values).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["success", "failure"]

FIELDS = (
    "id",
    "time",
    "action",
    "outcome",
    "status",
    "reason",
    "user",
    "key",
    "via",
    "admin",
    "org",
    "role",
    "targets",
    "ip",
    "agent",
    "request",
    "details",
)
"""The stream fields of an entry, always all of them and in this order (so that Redis stores
their names once per node of the stream, not once per entry)."""
_NAMED = tuple(item for name in FIELDS for item in (name, ""))


@dataclass(frozen=True)
class AuditRecord:
    id: str
    time_ms: int
    action: str
    outcome: Outcome
    user_id: str | None
    key_id: str | None
    via: str
    admin: bool
    org_id: str | None
    role: str | None
    status: int | None = None
    reason: str | None = None
    targets: dict[str, str] = field(default_factory=dict)
    ip: str | None = None
    user_agent: str | None = None
    request_id: str | None = None
    details: dict[str, str] = field(default_factory=dict)

    def fields(self) -> tuple[str, ...]:
        """The flat stream fields (FIELDS, in order)."""
        values = (
            self.id,
            str(self.time_ms),
            self.action,
            self.outcome,
            "" if self.status is None else str(self.status),
            self.reason or "",
            self.user_id or "",
            self.key_id or "",
            self.via,
            "1" if self.admin else "",
            self.org_id or "",
            self.role or "",
            # JSON (json's C encoder: the cheapest); an id the script chooses (LATE_ID) stays NUL.
            _compact(self.targets).replace("\\u0000", "\x00"),
            self.ip or "",
            self.user_agent or "",
            self.request_id or "",
            _compact(self.details),
        )
        flat = list(_NAMED)  # the names at the even places, the values at the odd
        flat[1::2] = values
        return tuple(flat)

    @classmethod
    def from_fields(cls, row: dict[str, str]) -> AuditRecord:
        status = row.get("status")
        return cls(
            id=row["id"],
            time_ms=int(row["time"]),
            action=row["action"],
            outcome="failure" if row.get("outcome") == "failure" else "success",
            user_id=row.get("user") or None,
            key_id=row.get("key") or None,
            via=row.get("via") or "",
            admin=row.get("admin") == "1",
            org_id=row.get("org") or None,
            role=row.get("role") or None,
            status=int(status) if status else None,
            reason=row.get("reason") or None,
            targets=_mapping(row.get("targets")),
            ip=row.get("ip") or None,
            user_agent=row.get("agent") or None,
            request_id=row.get("request") or None,
            details=_mapping(row.get("details")),
        )


def decoded_record(row: dict[str, str]) -> AuditRecord | None:
    """`AuditRecord.from_fields`, or None for an entry that does not decode (a field missing,
    bad JSON in its targets or details): one such entry must stop no search and no indexing."""
    try:
        return AuditRecord.from_fields(row)
    except (KeyError, ValueError):  # JSONDecodeError and UnicodeDecodeError included
        return None


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
"""Made once: json.dumps with arguments makes a new encoder at every call."""


def _compact(values: dict[str, str]) -> str:
    return _ENCODE(values) if values else ""


def _mapping(stored: str | None) -> dict[str, str]:
    if not stored:
        return {}
    loaded = json.loads(stored, strict=False)
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


class EventPart(BaseModel):
    id: str = Field(description="Unique, time-ordered: de-duplicate deliveries on it")
    kind: Literal["event"] = "event"
    dataset: Literal["acs.audit"] = "acs.audit"
    action: str = Field(description="What was done (docs/operations.md lists them)")
    outcome: Outcome
    reason: str | None = Field(
        default=None, description="Why it failed: an error code (never a message)"
    )


class UserPart(BaseModel):
    id: str | None = Field(description="Who acted; null: the control plane itself, or unknown")
    roles: list[str] = Field(default_factory=list, description="Their role where they acted")


class IdPart(BaseModel):
    id: str


class SourcePart(BaseModel):
    ip: str


class UserAgentPart(BaseModel):
    original: str


class HttpRequestPart(BaseModel):
    id: str | None = Field(default=None, description="The request id (X-Request-ID, logs)")


class HttpResponsePart(BaseModel):
    status_code: int


class HttpPart(BaseModel):
    request: HttpRequestPart | None = None
    response: HttpResponsePart | None = None


class AcsPart(BaseModel):
    key_id: str | None = Field(
        default=None, description="The API key (or session: `oidc-…`) of the call"
    )
    auth: str = Field(
        description="api_key, session, oidc, single_user, ticket, device, cli or system"
    )
    admin: bool = Field(default=False, description="A deployment admin's credential")
    targets: dict[str, str] = Field(
        default_factory=dict, description="What it was done to: `sandbox_id`, `user_id`, …"
    )
    details: dict[str, str] = Field(
        default_factory=dict, description="Named facts: a new role, the fields changed"
    )


class AuditEvent(BaseModel):
    """An audit entry, in Elastic Common Schema names (`acs` holds ours)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    timestamp: datetime = Field(alias="@timestamp")
    event: EventPart
    user: UserPart
    organization: IdPart | None = None
    source: SourcePart | None = None
    user_agent: UserAgentPart | None = None
    http: HttpPart | None = None
    acs: AcsPart

    @classmethod
    def of(cls, record: AuditRecord) -> AuditEvent:
        http = None
        if record.request_id or record.status is not None:
            http = HttpPart(
                request=HttpRequestPart(id=record.request_id) if record.request_id else None,
                response=HttpResponsePart(status_code=record.status)
                if record.status is not None
                else None,
            )
        return cls(
            timestamp=datetime.fromtimestamp(record.time_ms / 1000, UTC),
            event=EventPart(
                id=record.id, action=record.action, outcome=record.outcome, reason=record.reason
            ),
            user=UserPart(id=record.user_id, roles=[record.role] if record.role else []),
            organization=IdPart(id=record.org_id) if record.org_id else None,
            source=SourcePart(ip=record.ip) if record.ip else None,
            user_agent=UserAgentPart(original=record.user_agent) if record.user_agent else None,
            http=http,
            acs=AcsPart(
                key_id=record.key_id,
                auth=record.via,
                admin=record.admin,
                targets=record.targets,
                details=record.details,
            ),
        )

    def line(self) -> str:
        """One line of JSON (no newline inside, whatever a client sent: JSON escapes it), as the
        search answers it."""
        return self.model_dump_json()


def event_json(record: AuditRecord) -> dict[str, Any]:
    """AuditEvent.of(record) as its JSON (model_dump(mode="json")), built directly: a search
    answers up to 100 entries, and validating ten small models for each cost most of its time.
    tests/audit/test_event_json.py keeps the two the same."""
    status, request_id = record.status, record.request_id
    return {
        "@timestamp": datetime.fromtimestamp(record.time_ms / 1000, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
        "event": {
            "id": record.id,
            "kind": "event",
            "dataset": "acs.audit",
            "action": record.action,
            "outcome": record.outcome,
            "reason": record.reason,
        },
        "user": {"id": record.user_id, "roles": [record.role] if record.role else []},
        "organization": {"id": record.org_id} if record.org_id else None,
        "source": {"ip": record.ip} if record.ip else None,
        "user_agent": {"original": record.user_agent} if record.user_agent else None,
        "http": {
            "request": {"id": request_id} if request_id else None,
            "response": {"status_code": status} if status is not None else None,
        }
        if request_id or status is not None
        else None,
        "acs": {
            "key_id": record.key_id,
            "auth": record.via,
            "admin": record.admin,
            "targets": dict(record.targets),
            "details": dict(record.details),
        },
    }


def json_line(event: dict[str, Any]) -> str:
    """One entry's JSON on one line, as AuditEvent.line() writes it."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


class AuditEventPage(BaseModel):
    items: list[AuditEvent]
    next_page_id: str | None = None
