"""One gateway call to its upstream (a provider directly, or the translator), with time-outs
and retries, and the usage read from the answer.

Retries: connection errors, time-outs before the answer starts, 408, 429 and 5xx are retried
`retries` times with exponential backoff (`backoff` s doubling, at most 30 s, a provider's
Retry-After honoured up to that); the last failure is answered in OpenAI's error shape (a 429
keeps its Retry-After, so the agent backs off in turn). Once a stream has started nothing is
retried: an upstream failure, an idle upstream (no byte for `timeout` s) or the gateway
shutting down ends it with an `error` event and no `[DONE]`, so the client sees an error rather
than waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from controlplane.gateway.destinations import DestinationRefused, Destinations
from controlplane.gateway.translator_process import TranslatorProcess, TranslatorUnavailable
from controlplane.gateway.upstream import Upstream

log = structlog.get_logger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_BACKOFF = 30.0
CONNECT_TIMEOUT = 10.0
SNIPPET = 300
MIN_SECRET = 8
"""Shorter provider keys are not masked (they would mask ordinary words)."""
MAX_LINE = 1 << 17
"""The longest line of a stream relayed (aiohttp's readline limit, which the relay used)."""
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class GatewayError(Exception):
    """A call the gateway answers itself, in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape, which its clients (and LiteLLM) parse, plus our `detail`."""
        kind = "invalid_request_error" if self.status < 500 else "api_error"
        error = {"message": self.message, "type": kind, "code": self.code, "param": None}
        return {"error": error, "detail": self.message}


@dataclass
class Metered:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False
    """The provider reported usage; else the counts are estimates (4 characters a token)."""
    cost: float | None = None
    """LiteLLM's price of the call (translator, non-streaming), for models we have no price for."""
    attempts: int = 1
    streamed_chars: int = 0
    errors: list[str] = field(default_factory=list)

    def take(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.reported = True


def estimate_prompt(body: dict[str, Any]) -> int:
    return len(json.dumps(body.get("messages", []))) // 4 + 1


def _retry_after(headers: Any) -> float | None:
    try:
        return max(0.0, float(headers.get("Retry-After", "")))
    except (TypeError, ValueError):
        return None


class Forwarder:
    def __init__(
        self,
        destinations: Destinations,
        translator: TranslatorProcess,
        *,
        timeout: float,
        retries: int,
        backoff: float,
    ) -> None:
        self._destinations = destinations
        self._translator = translator
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._session: aiohttp.ClientSession | None = None
        # Made once, not per call: both are immutable.
        self._timeouts = {
            stream: aiohttp.ClientTimeout(
                total=None if stream else timeout, connect=CONNECT_TIMEOUT, sock_read=timeout
            )
            for stream in (False, True)
        }
        self.closing = asyncio.Event()
        self._streams: set[aiohttp.ClientResponse] = set()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, resolver=self._destinations.resolver, ttl_dns_cache=10
            )
            # No cookie jar: one session serves every user's calls, so a cookie a provider set
            # for one must not go out with another's (and none is kept or filtered per call).
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def close(self) -> None:
        self.shutdown()
        if self._session is not None:
            await self._session.close()

    async def _request(
        self, upstream: Upstream, payload: bytes, stream: bool
    ) -> aiohttp.ClientResponse:
        """One attempt; the response is open (the caller releases it)."""
        timeout = self._timeouts[stream]
        headers = {"Content-Type": "application/json"}
        if upstream.via == "direct":
            assert upstream.base_url is not None
            url = await self._destinations.prepare(upstream.base_url)
            if upstream.api_key:
                headers["Authorization"] = f"Bearer {upstream.api_key}"
            return await self.session.post(
                f"{url}/chat/completions", data=payload, headers=headers, timeout=timeout
            )
        await self._translator.ensure()
        headers["X-Acs-Model"] = upstream.model
        headers["X-Acs-Timeout"] = str(self._timeout)
        if upstream.api_key:
            headers["X-Acs-Api-Key"] = upstream.api_key
        if upstream.base_url:
            base = await self._destinations.prepare(upstream.base_url, resolve_names=True)
            headers["X-Acs-Api-Base"] = base
        return await self._translator.session.post(
            "http://translator/chat/completions", data=payload, headers=headers, timeout=timeout
        )

    async def open(
        self,
        upstream: Upstream,
        body: dict[str, Any],
        raw: bytes,
        stream: bool,
        metered: Metered,
    ) -> aiohttp.ClientResponse:
        """The upstream's successful response, open; retried as the module says. Raises
        GatewayError with what the client should be told. `raw` is the body as the client sent
        it: forwarded as it is unless the model's name or the stream's usage needs changing
        (the translator takes the model from a header)."""
        payload = raw
        if upstream.via == "direct":
            options = body.get("stream_options") or {}
            usage_missing = stream and not (
                isinstance(options, dict) and options.get("include_usage")
            )
            if body.get("model") != upstream.model or (usage_missing and "stream_options" in body):
                sent = dict(body, model=upstream.model)
                if usage_missing:
                    extra = options if isinstance(options, dict) else {}
                    sent["stream_options"] = {**extra, "include_usage": True}
                payload = json.dumps(sent, separators=(",", ":")).encode()
            elif usage_missing:
                # Only the option to add, to a body that has none: appended to the object as
                # it is, rather than the whole body serialised again (on the first token's path).
                payload = raw.rstrip()[:-1] + b',"stream_options":{"include_usage":true}}'
        last: GatewayError | None = None
        for attempt in range(self._retries + 1):
            metered.attempts = attempt + 1
            outcome = await self._attempt(upstream, payload, stream)
            if not isinstance(outcome, GatewayError):
                return outcome
            last = outcome
            metered.errors.append(last.code)
            if attempt == self._retries:
                break
            jitter = 0.8 + 0.4 * random.random()  # noqa: S311 (spreading retries, not secrets)
            delay = min(self._backoff * 2**attempt, MAX_BACKOFF) * jitter
            if last.retry_after is not None:
                delay = max(delay, min(last.retry_after, MAX_BACKOFF))
            log.info("llm_gateway_retry", attempt=attempt + 1, code=last.code, delay_s=delay)
            await asyncio.sleep(delay)
        assert last is not None
        if metered.attempts > 1:
            last.message += f" (after {metered.attempts} attempts)"
        raise last

    async def _attempt(
        self, upstream: Upstream, payload: bytes, stream: bool
    ) -> aiohttp.ClientResponse | GatewayError:
        """The open response of a success, the failure to retry, or GatewayError raised for one
        that retrying cannot mend."""
        try:
            response = await self._request(upstream, payload, stream)
        except DestinationRefused as exc:
            raise GatewayError(400, "destination_refused", f"llm_base_url: {exc}") from None
        except TranslatorUnavailable as exc:
            raise GatewayError(503, "translator_unavailable", str(exc)) from None
        except TimeoutError:
            return GatewayError(
                504, "upstream_timeout", f"the provider did not answer within {self._timeout:g} s"
            )
        except aiohttp.ClientError as exc:
            return GatewayError(
                502,
                "upstream_unreachable",
                mask(f"the provider is unreachable: {type(exc).__name__}: {exc}", upstream.api_key),
            )
        if response.status < 400:
            return response
        try:
            # The provider's words, without the key if it echoed it (some do, on a 401).
            text = mask(await response.text(errors="replace"), upstream.api_key)[:SNIPPET]
        except (aiohttp.ClientError, TimeoutError):
            text = ""
        finally:
            response.release()
        status = response.status
        if status not in RETRY_STATUSES:
            raise GatewayError(status, "upstream_error", f"the provider answered {status}: {text}")
        return GatewayError(
            429 if status == 429 else 502,
            "upstream_rate_limited" if status == 429 else "upstream_error",
            f"the provider answered {status}: {text}",
            retry_after=_retry_after(response.headers),
        )

    async def read_json(self, response: aiohttp.ClientResponse, metered: Metered) -> bytes:
        """A non-streaming answer's body, usage taken from it (found in the bytes: a key with
        unescaped quotes cannot occur inside a JSON string, so the first `"prompt_tokens"` is
        the usage's; parsed in full only when it is missing)."""
        try:
            raw = await response.read()
            cost = response.headers.get("X-Acs-Cost")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(
                502, "upstream_error", f"the provider's answer broke off: {exc}"
            ) from None
        finally:
            response.release()
        prompt, completion = _PROMPT.search(raw), _COMPLETION.search(raw)
        if prompt is not None and completion is not None:
            metered.prompt_tokens = int(prompt.group(1))
            metered.completion_tokens = int(completion.group(1))
            metered.reported = True
        else:
            try:
                data = json.loads(raw)
            except ValueError:
                raise GatewayError(
                    502, "upstream_error", "the provider's answer is not JSON"
                ) from None
            if isinstance(data, dict):
                metered.take(data.get("usage"))
                for choice in data.get("choices") or []:
                    message = (choice or {}).get("message") or {}
                    metered.streamed_chars += len(json.dumps(message))
        if cost is not None:
            with contextlib.suppress(ValueError):
                metered.cost = float(cost)
        return raw

    async def relay(
        self,
        response: aiohttp.ClientResponse,
        metered: Metered,
        *,
        keep_usage_chunk: bool,
        secret: str | None = None,
    ) -> AsyncIterator[bytes]:
        """The stream as it comes, in whole lines: what arrived together is yielded together
        (one write to the client rather than one per line, each a system call), never held
        back for more. Usage is taken from its chunks, the provider key masked. The last thing
        yielded after a failure is an `error` event. An idle provider is the connection's read
        timeout; `shutdown` closes every open upstream stream, which ends its relay here."""
        self._streams.add(response)
        key = secret.encode() if secret and len(secret) >= MIN_SECRET else None
        pending = b""  # the start of a line whose end has not arrived
        try:
            while True:
                try:
                    data = await response.content.readany()
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    if self.closing.is_set():
                        yield _error_event("stream_interrupted", "the gateway is shutting down")
                    elif isinstance(exc, TimeoutError):
                        reason = f"the provider sent nothing for {self._timeout:g} s"
                        yield _error_event("stream_interrupted", reason)
                    else:
                        reason = f"the provider's stream broke off: {exc!r}"
                        yield _error_event("upstream_error", reason)
                    return
                if not data:
                    last = self._lines(pending, metered, keep_usage_chunk, key)
                    if last:  # a last line without its newline
                        yield last
                    if self.closing.is_set():
                        yield _error_event("stream_interrupted", "the gateway is shutting down")
                    return
                pending += data
                end = pending.rfind(b"\n") + 1
                if end:
                    block, pending = pending[:end], pending[end:]
                    block = self._lines(block, metered, keep_usage_chunk, key)
                    if block:
                        yield block
                if len(pending) > MAX_LINE:
                    reason = f"the provider's stream broke off: a line over {MAX_LINE} bytes"
                    yield _error_event("upstream_error", reason)
                    return
        finally:
            self._streams.discard(response)
            response.release()

    @classmethod
    def _lines(
        cls, block: bytes, metered: Metered, keep_usage_chunk: bool, key: bytes | None
    ) -> bytes:
        """Whole lines of a stream as the client gets them: the usage chunk we asked for (and
        the client did not) left out with the blank line that ends its event, the provider key
        (some echo it in errors) masked."""
        lines = block.split(b"\n")
        kept: list[bytes] = []
        skip_blank = False
        for i, line in enumerate(lines):
            if skip_blank and line in (b"", b"\r") and i < len(lines) - 1:
                skip_blank = False  # the blank line that ended the event left out
                continue
            skip_blank = False
            if line.startswith(b"data: {") and not cls._inspect(line, metered, keep_usage_chunk):
                skip_blank = True
                continue
            kept.append(line)
        if len(kept) < len(lines):
            block = b"\n".join(kept)
        if key is not None and key in block:
            block = block.replace(key, b"***")
        return block

    def shutdown(self) -> None:
        """End every stream being relayed (with an error event) and refuse nothing else: new
        calls are the server's to refuse while it stops."""
        self.closing.set()
        for response in list(self._streams):
            response.close()

    @staticmethod
    def _inspect(line: bytes, metered: Metered, keep_usage_chunk: bool) -> bool:
        """Takes the usage from a `data: {` line (without its newline); False: leave it out."""
        if b'"usage"' not in line and b'"error"' not in line:
            metered.streamed_chars += len(line) + 1
            return True
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        if chunk.get("usage"):
            metered.take(chunk["usage"])
            if not keep_usage_chunk and not chunk.get("choices"):
                return False  # we asked for it; the client did not
        metered.streamed_chars += len(line) + 1
        return True


def mask(text: str, secret: str | None) -> str:
    """`text` without `secret` (the provider key), for anything the caller is told."""
    return text.replace(secret, "***") if secret and len(secret) >= MIN_SECRET else text


def _error_event(code: str, message: str) -> bytes:
    body = {"error": {"message": message, "type": "api_error", "code": code}}
    return f"data: {json.dumps(body)}\n\n".encode()
