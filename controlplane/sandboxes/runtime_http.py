"""Requests a browser client has the control plane send to a sandbox's agent server, answered
with what the agent server said: `POST /api/cloud-proxy` (cloud_proxy.py) and the
conversation's git and file reads (controlplane/conversations/workspace.py).

The destination is always a sandbox's own agent server as this control plane reaches it, never
a URL a client chose; only the sandbox's session key and the content headers travel with the
request (never the caller's API key or cookie); the answer is bounded in size and time, and
only its content headers come back, under the sandbox CSP (controlplane/api/sandbox_answers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from controlplane.api import sandbox_answers
from controlplane.errors import ControlPlaneError

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
FORWARDED_REQUEST_HEADERS = frozenset({"content-type", "accept"})
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type", "content-disposition", "cache-control"})


class SandboxUnreachable(ControlPlaneError):
    """The sandbox's agent server did not answer (or not in time)."""

    code = "sandbox_unreachable"
    status = 502


class SandboxAnswerTooLarge(ControlPlaneError):
    code = "sandbox_answer_too_large"
    status = 502


@dataclass(frozen=True)
class RuntimeAnswer:
    status: int
    body: bytes
    headers: dict[str, str]

    def response(self) -> web.Response:
        """The answer for the client, unable to act on our origin (sandbox_answers.py): what it
        says of its body, under the sandbox CSP and nosniff (a file of the workspace served as
        HTML would otherwise run as a page of ours)."""
        headers = dict(sandbox_answers.filtered(self.headers.items()))
        headers.update(sandbox_answers.ANSWER_HEADERS)
        return web.Response(status=self.status, body=self.body, headers=headers)


class RuntimeHttp:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http

    async def send(
        self,
        method: str,
        url: str,
        session_key: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 30,
    ) -> RuntimeAnswer:
        """One request to `url` (a sandbox's agent server) with its session key. Raises
        SandboxUnreachable (no answer, or none within `timeout` s) or SandboxAnswerTooLarge."""
        sent = {k: v for k, v in (headers or {}).items() if k.lower() in FORWARDED_REQUEST_HEADERS}
        sent["X-Session-API-Key"] = session_key
        try:
            async with self._http.request(
                method,
                url,
                data=body,
                headers=sent,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                if (resp.content_length or 0) > MAX_RESPONSE_BYTES:
                    raise _too_large()
                content = await resp.content.read(MAX_RESPONSE_BYTES + 1)
                if len(content) > MAX_RESPONSE_BYTES:
                    raise _too_large()
                kept = {
                    k: v for k, v in resp.headers.items() if k.lower() in FORWARDED_RESPONSE_HEADERS
                }
                return RuntimeAnswer(resp.status, content, kept)
        except TimeoutError:
            raise SandboxUnreachable(
                f"the sandbox's agent server did not answer within {timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SandboxUnreachable(
                f"the sandbox's agent server does not answer ({type(exc).__name__})"
            ) from None


def _too_large() -> SandboxAnswerTooLarge:
    return SandboxAnswerTooLarge(
        f"the sandbox's answer is larger than {MAX_RESPONSE_BYTES // (1024 * 1024)} MiB"
    )
