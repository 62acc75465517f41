"""HTTP calls from the control plane to a sandbox's agent server (docs/agent-protocol.md)."""

from __future__ import annotations

from typing import Any

import aiohttp

from controlplane.errors import Conflict, ControlPlaneError, NotFound


class AgentUnavailable(ControlPlaneError):
    """The sandbox's agent server does not answer."""

    code = "agent_unavailable"
    status = 503


class AgentRejected(ControlPlaneError):
    """The agent server answered with an error; its detail is kept."""

    code = "agent_error"
    status = 502


class AgentClient:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http

    async def call(
        self,
        method: str,
        url: str,
        key: str,
        *,
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        timeout: float = 30,
    ) -> Any:
        """One call; raises AgentUnavailable, NotFound (404) or AgentRejected (other errors).

        A call that finds its pooled connection closed by the server is sent once more on a new
        one: a sandbox that was paused past the server's keep-alive (uvicorn's is 5 s, so a
        claimed warm-pool member of the official server) closes it only once unpaused."""
        for attempt in (1, 2):
            try:
                return await self._once(method, url, key, body=body, params=params, timeout=timeout)
            except aiohttp.ServerDisconnectedError as exc:
                if attempt == 2:
                    raise AgentUnavailable(
                        f"the sandbox's agent server does not answer ({exc!r})"
                    ) from None
        raise AssertionError("unreachable")

    async def _once(
        self,
        method: str,
        url: str,
        key: str,
        *,
        body: Any,
        params: list[tuple[str, str]] | None,
        timeout: float,
    ) -> Any:
        try:
            async with self._http.request(
                method,
                url,
                json=body,
                params=params,
                headers={"X-Session-API-Key": key},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                payload = await resp.json(content_type=None) if resp.content_length != 0 else None
                if resp.status == 404:
                    raise NotFound(_detail(payload) or "not found on the agent server")
                if resp.status == 409:
                    raise Conflict(_detail(payload) or "conflict on the agent server")
                if resp.status >= 400:
                    raise AgentRejected(
                        f"agent server answered {resp.status}: {_detail(payload) or 'no detail'}"
                    )
                return payload
        except aiohttp.ServerDisconnectedError:
            raise
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise AgentUnavailable(
                f"the sandbox's agent server does not answer ({exc!r})"
            ) from None

    async def start_conversation(self, base: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(
            "POST", f"{base}/api/conversations", key, body=body, timeout=120
        )
        return result

    async def conversations(self, base: str, key: str, ids: list[str]) -> list[Any]:
        result: list[Any] = await self.call(
            "GET", f"{base}/api/conversations", key, params=[("ids", i) for i in ids], timeout=10
        )
        return result

    async def send_message(self, base: str, key: str, conv: str, message: dict[str, Any]) -> None:
        await self.call("POST", f"{base}/api/conversations/{conv}/events", key, body=message)

    async def respond(self, base: str, key: str, conv: str, accept: bool, reason: str) -> None:
        await self.call(
            "POST",
            f"{base}/api/conversations/{conv}/events/respond_to_confirmation",
            key,
            body={"accept": accept, "reason": reason},
        )

    async def pause(self, base: str, key: str, conv: str) -> None:
        await self.call("POST", f"{base}/api/conversations/{conv}/pause", key)

    async def run(self, base: str, key: str, conv: str) -> None:
        await self.call("POST", f"{base}/api/conversations/{conv}/run", key)

    async def delete(self, base: str, key: str, conv: str) -> None:
        await self.call("DELETE", f"{base}/api/conversations/{conv}", key)

    async def bash(
        self, base: str, key: str, command: str, cwd: str | None, timeout: int
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(
            "POST",
            f"{base}/api/bash/execute_bash_command",
            key,
            body={"command": command, "cwd": cwd, "timeout": timeout},
            timeout=timeout + 10,
        )
        return result


def _detail(payload: Any) -> str | None:
    if isinstance(payload, dict) and "detail" in payload:
        return str(payload["detail"])
    return None
