"""A small asynchronous client for the control plane's REST API (aiohttp).

Errors are `OpsError`s: `ApiError` (the server answered with a non-2xx status; it carries the
status and the `detail` of the JSON error body), `Unreachable` (no answer at all) and `InvalidId`
(an id refused before any request).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any

import aiohttp

USER_AGENT = "controlplane-cli"
_PATH_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_PAGES = 10_000


class OpsError(Exception):
    """Root of what the client reports; its text is one line for the terminal."""


class ApiError(OpsError):
    """A non-2xx answer: `status`, and `detail` as one line."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(status, detail)
        self.status = status
        self.detail = detail

    def __str__(self) -> str:
        try:
            phrase = HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        head = f"{self.status} {phrase}".rstrip()
        return f"{head}: {self.detail}" if self.detail else head


class Unreachable(OpsError):
    """The server did not answer (connection refused, DNS, timeout, TLS)."""


class InvalidId(OpsError):
    """A sandbox id that could change the request path; refused before any request."""


def render_detail(body: Any) -> str:
    """The `detail` of an error body as one line; 422 lists become `loc: msg; loc: msg`."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                parts.append(str(item))
        detail = "; ".join(parts)
    elif not isinstance(detail, str):
        detail = json.dumps(detail)
    return " ".join(detail.split())


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    """`/api/v1/sandboxes/<id><suffix>`; an id that could change the path is refused here."""
    if not _PATH_ID.fullmatch(sandbox_id):
        raise InvalidId(f"{sandbox_id!r} is not a sandbox id")
    return f"/api/v1/sandboxes/{sandbox_id}{suffix}"


class RestClient:
    """One API key against one base URL. Use as `async with RestClient(...) as api:`."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"X-Session-API-Key": api_key, "User-Agent": USER_AGENT}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RestClient:
        self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def request(self, method: str, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON body of a 2xx answer; raises ApiError or Unreachable."""
        if self._http is None:
            raise RuntimeError("RestClient used outside `async with`")
        url = self.base_url + path
        try:
            async with self._http.request(method, url, params=params) as resp:
                text = await resp.text()
                try:
                    body = json.loads(text) if text else None
                except json.JSONDecodeError:
                    body = None
                if resp.status >= 300:
                    if body is None:
                        detail = " ".join(text.split())[:200] or (resp.reason or "")
                    else:
                        detail = render_detail(body)
                    retry_after = resp.headers.get("Retry-After")
                    if resp.status in (429, 503) and retry_after and retry_after.isdigit():
                        detail = f"{detail} (retry after {retry_after} s)"
                    raise ApiError(resp.status, detail)
                if body is None and text:
                    raise ApiError(resp.status, f"not a JSON answer from {url}: {text[:200]!r}")
                return body
        except TimeoutError:
            raise Unreachable(
                f"{method} {url}: no answer within {self._timeout.total:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise Unreachable(f"cannot reach {self.base_url}: {exc}") from None

    # -- sandboxes ------------------------------------------------------------------------------

    async def search_sandboxes(self, params: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Every match, following `next_page_id` to the last page."""
        page_id: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            query = dict(params)
            query.setdefault("limit", "100")
            if page_id is not None:
                query["page_id"] = page_id
            page = await self.request("GET", "/api/v1/sandboxes/search", query)
            for item in page["items"]:
                yield item
            page_id = page.get("next_page_id")
            if page_id is None:
                return
            if page_id in seen:
                raise ApiError(500, f"the server repeated page cursor {page_id!r}")
            seen.add(page_id)
        raise ApiError(500, f"more than {_MAX_PAGES} pages of sandboxes")

    async def get_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        body: dict[str, Any] = await self.request("GET", sandbox_path(sandbox_id))
        return body

    async def pause_sandbox(self, sandbox_id: str) -> None:
        await self.request("POST", sandbox_path(sandbox_id, "/pause"))

    async def resume_sandbox(self, sandbox_id: str) -> None:
        await self.request("POST", sandbox_path(sandbox_id, "/resume"))

    async def delete_sandbox(self, sandbox_id: str) -> None:
        await self.request("DELETE", sandbox_path(sandbox_id))
