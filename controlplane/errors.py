"""Domain errors. Each has a stable `code` and an HTTP status that one middleware renders.

Domain code raises these and never imports aiohttp.web. The root and RuntimeUnavailable come
from drivers/errors.py, so that a driver's errors are ControlPlaneErrors too.
"""

from __future__ import annotations

from typing import Any

from drivers.errors import RuntimeUnavailable, ServiceError

__all__ = [
    "Conflict",
    "ControlPlaneError",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "QuotaExceeded",
    "RuntimeUnavailable",
    "SandboxNotFound",
    "SnapshotDamaged",
    "SnapshotNotFound",
    "SpecInvalid",
    "SpecNotFound",
    "StoreUnavailable",
    "Unauthorized",
]

ControlPlaneError = ServiceError
"""Root of every error the API reports on purpose."""


class NotFound(ControlPlaneError):
    code = "not_found"
    status = 404


class SandboxNotFound(NotFound):
    code = "sandbox_not_found"


class SpecNotFound(NotFound):
    code = "sandbox_spec_not_found"


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"


class StoreUnavailable(ControlPlaneError):
    """The snapshot store (an OCI registry) does not answer, or refuses what it should take."""

    code = "snapshot_store_unavailable"
    status = 503


class SnapshotDamaged(ControlPlaneError):
    """What the store gave back is not what was stored: a digest or an authentication tag
    does not match (a corrupted or tampered blob). Nothing is restored from it."""

    code = "snapshot_damaged"
    status = 500


class Conflict(ControlPlaneError):
    code = "conflict"
    status = 409


class Unauthorized(ControlPlaneError):
    code = "unauthorized"
    status = 401


class QuotaExceeded(ControlPlaneError):
    """A per-user or host cap; carries a Retry-After hint in seconds."""

    code = "quota_exceeded"
    status = 429

    def __init__(self, message: str, retry_after: int = 30, **context: Any) -> None:
        super().__init__(message, **context)
        self.retry_after = retry_after


class SpecInvalid(ControlPlaneError):
    """A sandbox spec file cannot be used; raised at start-up."""

    code = "sandbox_spec_invalid"
    status = 500


class InvalidInput(ControlPlaneError):
    """Input that passed schema validation but breaks a rule checked by a service.

    Rendered in the 422 list format with `loc` pointing at the input.
    """

    code = "invalid_input"
    status = 422

    def __init__(self, message: str, loc: list[str], error_type: str = "value_error") -> None:
        super().__init__(message)
        self.loc = loc
        self.error_type = error_type


class Forbidden(ControlPlaneError):
    code = "forbidden"
    status = 403
