"""One gateway call to its upstream (a provider directly, or the translator), with time-outs
and retries, and the usage read from the answer.

Retries: connection errors, time-outs before the answer starts, 408, 429 and 5xx are retried
`retries` times with exponential backoff (`backoff` s doubling, at most 30 s, a provider's
Retry-After honoured up to that); the last failure is answered in OpenAI's error shape (a 429
keeps its Retry-After, so the agent backs off in turn). A redirect is a failure, never
followed (controlplane/outbound/client.py). Once a stream has started nothing is retried:
stream.py relays it and ends it with an `error` event and no `[DONE]` on any failure, so the
client sees an error rather than waiting.

Answers are the provider's, whoever it is (answers.py): a non-streamed one is read up to
MAX_ANSWER bytes, as sent (never inflated), and must be a chat completion in strict JSON with a
well-formed usage, or the call answers 502 `upstream_error` and nothing is metered.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import structlog

from controlplane.gateway import stream as streams
from controlplane.gateway.answers import MalformedAnswer, Metered, completion_of, cost_of_header
from controlplane.gateway.destinations import Destinations
from controlplane.gateway.translator_process import TranslatorProcess, TranslatorUnavailable
from controlplane.gateway.upstream import Upstream
from controlplane.outbound.client import refusal_of
from controlplane.outbound.policy import DestinationRefused

log = structlog.get_logger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_BACKOFF = 30.0
CONNECT_TIMEOUT = 10.0
SNIPPET = 300
MIN_SECRET = 8
"""Shorter provider keys are not masked (they would mask ordinary words)."""
MAX_ANSWER = 64 << 20
"""The largest non-streamed answer read (a chat completion is kilobytes; a provider that sends
more is answered 502 rather than filling the control plane's memory)."""
MAX_RETRY_AFTER = 3600.0
"""The longest Retry-After passed on from a provider."""


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


def estimate_prompt(body: dict[str, Any]) -> int:
    return len(json.dumps(body.get("messages", []))) // 4 + 1


def _retry_after(headers: Any) -> float | None:
    try:
        seconds = float(headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER) if math.isfinite(seconds) else None


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
        # Made once, not per call: both are immutable.
        self._timeouts = {
            stream: aiohttp.ClientTimeout(
                total=None if stream else timeout, connect=CONNECT_TIMEOUT, sock_read=timeout
            )
            for stream in (False, True)
        }
        self.closing = asyncio.Event()
        self._streams: set[aiohttp.ClientResponse] = set()

    async def close(self) -> None:
        self.shutdown()
        await self._destinations.close()

    async def _request(
        self, upstream: Upstream, payload: bytes, stream: bool
    ) -> aiohttp.ClientResponse:
        """One attempt; the response is open (the caller releases it)."""
        timeout = self._timeouts[stream]
        headers = {"Content-Type": "application/json"}
        if upstream.via == "direct":
            assert upstream.base_url is not None
            url = await self._destinations.prepare(upstream.base_url)
            headers["Accept-Encoding"] = "identity"
            if upstream.api_key:
                headers["Authorization"] = f"Bearer {upstream.api_key}"
            return await self._destinations.client.post(
                f"{url}/chat/completions", data=payload, headers=headers, timeout=timeout
            )
        await self._translator.ensure()
        headers["X-Acs-Model"] = upstream.model
        headers["X-Acs-Timeout"] = str(self._timeout)
        headers["X-Acs-Outbound"] = self._destinations.rules_json
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
            refused = refusal_of(exc)
            if refused is not None:
                raise GatewayError(400, "destination_refused", f"llm_base_url: {refused}") from None
            return GatewayError(
                502,
                "upstream_unreachable",
                mask(f"the provider is unreachable: {type(exc).__name__}: {exc}", upstream.api_key),
            )
        status = response.status
        if 200 <= status < 300:
            return response
        refused_there = upstream.via == "translator" and response.headers.get("X-Acs-Refused")
        try:
            # The provider's words, without the key if it echoed it (some do, on a 401).
            text = mask(await _snippet(response), upstream.api_key)[:SNIPPET]
        except (aiohttp.ClientError, TimeoutError):
            text = ""
        finally:
            response.release()
        if refused_there:
            raise GatewayError(400, "destination_refused", f"llm_base_url: {refused_there}")
        said = f"the provider answered {status}: {text}"
        if status < 400:
            raise GatewayError(502, "upstream_error", f"{said} (no redirect is followed)")
        if status not in RETRY_STATUSES:
            raise GatewayError(status if status < 600 else 502, "upstream_error", said)
        return GatewayError(
            429 if status == 429 else 502,
            "upstream_rate_limited" if status == 429 else "upstream_error",
            said,
            retry_after=_retry_after(response.headers),
        )

    async def read_json(
        self, response: aiohttp.ClientResponse, metered: Metered, *, translated: bool = False
    ) -> bytes:
        """A non-streaming answer's body, checked (answers.py) and its usage taken: GatewayError
        502 when it broke off, is larger than MAX_ANSWER or is not a well-formed chat
        completion. `translated`: the translator's answer, whose price header counts."""
        try:
            raw = await _read_capped(response)
            cost = response.headers.get("X-Acs-Cost") if translated else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(
                502, "upstream_error", f"the provider's answer broke off: {exc}"
            ) from None
        finally:
            response.release()
        try:
            data, usage = completion_of(raw)
        except MalformedAnswer as exc:
            raise GatewayError(
                502, "upstream_error", f"the provider's answer is malformed: {exc}"
            ) from None
        if usage is not None:
            metered.prompt_tokens, metered.completion_tokens = usage
            metered.reported = True
        else:
            for choice in data["choices"]:
                message = choice.get("message")
                if message is not None:
                    metered.streamed_chars += len(json.dumps(message))
        metered.cost = cost_of_header(cost)
        return raw

    async def relay(
        self,
        response: aiohttp.ClientResponse,
        metered: Metered,
        *,
        keep_usage_chunk: bool,
        secret: str | None = None,
    ) -> AsyncIterator[bytes]:
        """The stream as it comes, checked and metered (stream.py), the provider key masked;
        `shutdown` closes every open upstream stream, which ends its relay."""
        self._streams.add(response)
        key = secret.encode() if secret and len(secret) >= MIN_SECRET else None
        try:
            async for block in streams.relay(
                response,
                metered,
                keep_usage_chunk=keep_usage_chunk,
                key=key,
                idle=self._timeout,
                closing=self.closing,
            ):
                yield block
        finally:
            self._streams.discard(response)
            response.release()

    def shutdown(self) -> None:
        """End every stream being relayed (with an error event) and refuse nothing else: new
        calls are the server's to refuse while it stops."""
        self.closing.set()
        for response in list(self._streams):
            response.close()


def mask(text: str, secret: str | None) -> str:
    """`text` without `secret` (the provider key), for anything the caller is told."""
    return text.replace(secret, "***") if secret and len(secret) >= MIN_SECRET else text


async def _snippet(response: aiohttp.ClientResponse) -> str:
    """The start of an error's body (what is left unread goes with the connection)."""
    data = b""
    while len(data) < 4 * SNIPPET:
        chunk = await response.content.readany()
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, or GatewayError 502 past MAX_ANSWER bytes."""
    too_large = GatewayError(
        502, "upstream_error", f"the provider's answer is larger than {MAX_ANSWER} bytes"
    )
    if response.content_length is not None:  # most answers: read at once, as aiohttp does
        if response.content_length > MAX_ANSWER:
            raise too_large
        return await response.read()
    data = bytearray()
    async for chunk in response.content.iter_any():
        data += chunk
        if len(data) > MAX_ANSWER:
            raise too_large
    return bytes(data)
