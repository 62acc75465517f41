"""structlog set-up: JSON off a TTY, console on one, secrets redacted before rendering."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, TextIO

import structlog

REDACTED = "[redacted]"

# Any key whose lower-cased name contains one of these is replaced before a line is written.
SECRET_MARKERS: tuple[str, ...] = (
    "api_key",
    "apikey",
    "token",
    "secret",
    "password",
    "authorization",
    "session_key",
    "cookie",
    "fernet",
)


def _is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > 8:
        return value
    if isinstance(value, MutableMapping):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _is_secret_key(k) and v
                else _redact(v, depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: blank every value stored under a secret-looking key."""
    return _redact(event_dict)  # type: ignore[no-any-return]  # _redact keeps the shape


def _stamp_worker(
    index: int,
) -> Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]:
    def stamp(
        _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event["worker"] = index
        return event

    return stamp


def configure_logging(
    fmt: str = "auto", level: str = "info", stream: TextIO | None = None, worker: int | None = None
) -> None:
    """Configure structlog once for the process. `fmt` is auto, json or console; `worker`: the
    index of this ACS_WORKERS worker, in every line (controlplane/workers.py)."""
    out = stream or sys.stdout
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    # Tracebacks without frame locals: locals hold plain secrets (the presented API key in the
    # auth middleware, decrypted values in services) under names the redaction cannot know.
    renderer: Iterable[Any] = (
        [structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)]
        if use_console
        else [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(),
        ]
    )
    # Authlib logs a sign-in's PKCE verifier at DEBUG (stdlib logging): never below INFO, even
    # when something routes the standard library's records somewhere.
    logging.getLogger("authlib").setLevel(logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *([_stamp_worker(worker)] if worker is not None else []),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
