"""Errors aiohttp answers before any middleware runs, in our JSON error format.

aiohttp's HTTP parser refuses a request line or header over 8,190 bytes, a malformed header, a
bad method or chunk, and answers with a plain-text body from `RequestHandler.handle_error`; so
does an exception that escapes every middleware. No application hook sees those requests, so the
method itself is replaced, once per process, for every server the process runs (the API, the
webhook listener, test servers).

The answer never echoes what was refused: a too-long URL may carry a key in its query.
"""

from __future__ import annotations

from http import HTTPStatus

import structlog
from aiohttp import http_exceptions, web, web_protocol

log = structlog.get_logger("controlplane.http")

_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "request line or a header is longer than the server accepts"),
    (http_exceptions.BadHttpMethod, "malformed HTTP method"),
    (http_exceptions.InvalidURLError, "malformed request target"),
    (http_exceptions.InvalidHeader, "malformed HTTP header"),
    (http_exceptions.BadStatusLine, "malformed HTTP request line"),
    (http_exceptions.TransferEncodingError, "malformed Transfer-Encoding or chunk"),
    (http_exceptions.ContentLengthError, "malformed Content-Length"),
)


def _detail(status: int, exc: BaseException | None) -> str:
    if status >= 500:
        return "Internal server error"
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    try:
        return f"malformed HTTP request ({HTTPStatus(status).phrase})"
    except ValueError:
        return "malformed HTTP request"


def json_handle_error(
    self: web_protocol.RequestHandler,
    request: web.BaseRequest,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    """`RequestHandler.handle_error`, answering `{"detail": ...}` (the connection is closed, as
    aiohttp does: after a parser error the stream's framing cannot be trusted)."""
    if request.writer.output_size > 0:
        raise ConnectionError("response already started; cannot send an error response")
    detail = _detail(status, exc)
    if status >= 500:
        log.error("unhandled_server_error", status=status, error=repr(exc))
    else:
        log.info("http_parser_error", status=status, error_type=type(exc).__name__, detail=detail)
    response = web.json_response({"detail": detail}, status=status)
    response.force_close()
    return response


def install() -> None:
    """Make every aiohttp server of this process answer parser-level errors in JSON."""
    web_protocol.RequestHandler.handle_error = json_handle_error  # type: ignore[method-assign]  # on purpose
