"""OpenAI-compatible chat-completions client (``POST {base_url}/chat/completions``)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .masking import Masker
from .models import LLMSettings

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
BODY_SNIPPET = 500


class LLMError(Exception):
    """The LLM could not be reached or answered an error (after the retries)."""


class _Retryable(Exception):
    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it


@dataclass(frozen=True)
class LLMResponse:
    id: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    latency_ms: int = 0

    def assistant_message(self) -> dict[str, Any]:
        """The reply as an entry of the next request's ``messages``."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        return message


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _tool_calls(raw: Any) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for item in raw or []:
        function = item.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(
                id=str(item.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
                name=str(function.get("name", "")),
                arguments=arguments,
            )
        )
    return calls


def parse_response(data: Any) -> LLMResponse:
    """Parse a chat-completions answer; ValueError when it has no usable message."""
    try:
        message = data["choices"][0]["message"]
        usage = data.get("usage") or {}
        return LLMResponse(
            id=data.get("id"),
            content=_text(message.get("content")),
            tool_calls=_tool_calls(message.get("tool_calls")),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"unexpected chat completion answer: {exc!r}") from exc


def _retry_after(headers: Any) -> float | None:
    try:
        return max(0.0, float(headers.get("Retry-After", "")))
    except ValueError:
        return None


class LLMClient:
    def __init__(self, config: LLMSettings, session: aiohttp.ClientSession, masker: Masker) -> None:
        self.config = config
        self._session = session
        self._masker = masker
        self.url = (config.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.config.key:
            headers["Authorization"] = f"Bearer {self.config.key}"
        return headers

    def _body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.top_p is not None:
            body["top_p"] = self.config.top_p
        if self.config.max_output_tokens is not None:
            body["max_tokens"] = self.config.max_output_tokens
        return body

    async def _attempt(self, body: dict[str, Any]) -> LLMResponse:
        timeout = aiohttp.ClientTimeout(total=self.config.call_timeout)
        try:
            async with self._session.post(
                self.url, json=body, headers=self._headers(), timeout=timeout
            ) as resp:
                text = await resp.text(errors="replace")
                if resp.status in (408, 429) or resp.status >= 500:
                    raise _Retryable(
                        f"HTTP {resp.status}: {text[:BODY_SNIPPET]}", _retry_after(resp.headers)
                    )
                if resp.status >= 400:
                    raise LLMError(f"HTTP {resp.status} from {self.url}: {text[:BODY_SNIPPET]}")
                try:
                    return parse_response(json.loads(text))
                except ValueError as exc:
                    raise LLMError(f"{exc} (from {self.url})") from exc
        except TimeoutError as exc:
            raise _Retryable(f"timed out after {self.config.call_timeout:g} s") from exc
        except aiohttp.ClientError as exc:
            raise _Retryable(f"connection error: {exc}") from exc

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        wait: float = min(self.config.retry_min_wait * 2.0**retry, self.config.retry_max_wait)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.config.retry_max_wait))
        return wait

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> LLMResponse:
        """One completion; retried ``num_retries`` times on network errors, 408, 429 and 5xx."""
        body = self._body(messages, tools)
        attempts = self.config.num_retries + 1
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                response = await self._attempt(body)
            except _Retryable as exc:
                detail = self._masker.text(str(exc))
                if attempt == attempts:
                    raise LLMError(
                        f"LLM call to {self.url} failed after {attempts} attempt(s): {detail}"
                    ) from None
                wait = self._backoff(attempt - 1, exc.retry_after)
                log.warning(
                    "LLM attempt %d/%d failed (%s); retrying in %.2f s",
                    attempt,
                    attempts,
                    detail[:200],
                    wait,
                )
                await asyncio.sleep(wait)
                continue
            latency = int((time.monotonic() - started) * 1000)
            return LLMResponse(
                id=response.id,
                content=response.content,
                tool_calls=response.tool_calls,
                prompt_tokens=response.prompt_tokens,
                completion_tokens=response.completion_tokens,
                attempts=attempt,
                latency_ms=latency,
            )
        raise AssertionError("unreachable")  # pragma: no cover
