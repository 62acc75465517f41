"""A streamed answer relayed to the client as it comes, checked as it passes.

In whole lines: what arrived together is yielded together (one write to the client rather than
one per line, each a system call), never held back for more. Each line must be server-sent
events: blank, a comment (`:`), `event:`, `id:`, `retry:`, or `data:` carrying `[DONE]` or a
JSON object (strict: answers.py); an object's `usage` is metered (and the usage chunk the
gateway asked for, which the client did not, left out with the blank line that ends its event);
the provider key, should the provider echo it, is masked. Anything else ends the stream: what
came before it goes out, then an `error` event (`upstream_error`), and no `[DONE]`; so do a
line over MAX_LINE, a stream that breaks off or ends before its `[DONE]`, an idle provider (the
connection's read timeout: `stream_interrupted`) and the gateway shutting down. Nothing raises
out of the relay but the client's own going away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from controlplane.gateway.answers import MalformedAnswer, Metered, strict_json

MAX_LINE = 1 << 17
"""The longest line of a stream relayed (aiohttp's readline limit, which the relay used)."""
SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")
"""The lines of server-sent events but `data:` and blank ones (relayed as they are)."""


class Broken(Exception):
    """A line that is not what a chat-completions stream sends (the message says what)."""


def error_event(code: str, message: str, *, after: bytes = b"\n\n") -> bytes:
    """An `error` event; `after`, the end of what the client got so far: an event left open
    there is ended first, so the error is an event of its own."""
    body = {"error": {"message": message, "type": "api_error", "code": code}}
    start = b"" if not after or after.replace(b"\r", b"").endswith(b"\n\n") else b"\n"
    return start + f"data: {json.dumps(body)}\n\n".encode()


def _data(line: bytes, metered: Metered, keep_usage_chunk: bool) -> bool:
    """Checks a `data:` line (without its newline) and meters it. False: leave it out. Raises
    Broken."""
    payload = line[5:]
    if payload[:1] == b" ":
        payload = payload[1:]
    if payload == b"[DONE]":
        metered.finished = True
        return True
    try:
        chunk: Any = strict_json(payload)
    except MalformedAnswer as exc:
        raise Broken(f"malformed: an event is {exc}") from None
    if not isinstance(chunk, dict):
        raise Broken("malformed: an event is not a JSON object")
    if "error" in chunk:
        metered.upstream_error = True
    if chunk.get("usage") is not None:
        try:
            metered.take(chunk["usage"])
        except MalformedAnswer as exc:
            raise Broken(f"malformed: {exc}") from None
        if not keep_usage_chunk and not chunk.get("choices"):
            return False  # we asked for it; the client did not
    metered.streamed_chars += len(line) + 1
    return True


def lines(
    block: bytes, metered: Metered, keep_usage_chunk: bool, skip_blank: bool = False
) -> tuple[bytes, str | None, bool]:
    """Whole lines as the client gets them, why the stream broke, if it did (the lines before
    the broken one are returned; nothing after it), and whether the next block begins with the
    blank line of an event left out here (`skip_blank`: this block does). After `[DONE]` only
    blank lines (its event's end) are kept."""
    split = block.split(b"\n")
    last = len(split) - 1  # after a final newline, split's last item is no line
    kept: list[bytes] = []
    broken: str | None = None
    for i, line in enumerate(split):
        bare = line[:-1] if line[-1:] == b"\r" else line
        if not bare:
            if skip_blank and i < last:
                skip_blank = False  # the blank line that ended a left-out event
                continue
            kept.append(line)
            continue
        skip_blank = False
        if metered.finished:
            continue  # after [DONE]: nothing more is relayed
        try:
            if bare[:5] == b"data:":
                if not _data(bare, metered, keep_usage_chunk):
                    skip_blank = True
                    continue
            elif not bare.startswith(SSE_FIELDS):
                raise Broken("malformed: a line is not a server-sent event")
        except Broken as exc:
            broken = str(exc)
            if kept:
                kept.append(b"")  # the kept lines' last newline
            break
        kept.append(line)
    out = b"\n".join(kept) if len(kept) != len(split) or broken else block
    return out, broken, skip_blank


class _Relay:
    """One stream's relay state: what is pending, what the client got last, whether it ended."""

    def __init__(
        self, metered: Metered, keep_usage_chunk: bool, key: bytes | None, closing: asyncio.Event
    ) -> None:
        self.metered = metered
        self.keep_usage_chunk = keep_usage_chunk
        self.key = key
        self.closing = closing
        self.pending = b""  # the start of a line whose end has not arrived
        self.tail = b"\n\n"  # the end of what the client got so far (CRLF lines: 4 bytes)
        self.skip_blank = False  # the next line ends an event left out
        self.done = False

    def ending(self, code: str, message: str) -> bytes:
        self.done = True
        return error_event(code, message, after=self.tail)

    def failed(self, exc: Exception, idle: float) -> bytes:
        """The last event of a stream whose read raised `exc` (none after its [DONE]: the
        stream was whole)."""
        if self.metered.finished:
            self.done = True
            return b"" if self.tail.replace(b"\r", b"").endswith(b"\n\n") else b"\n"
        if self.closing.is_set():
            return self.ending("stream_interrupted", "the gateway is shutting down")
        if isinstance(exc, TimeoutError):
            return self.ending("stream_interrupted", f"the provider sent nothing for {idle:g} s")
        return self.ending("upstream_error", f"the provider's stream broke off: {exc!r}")

    def feed(self, data: bytes) -> list[bytes]:
        """What goes to the client for `data` (b"": the end of the stream)."""
        if data:
            self.pending += data
            end = self.pending.rfind(b"\n") + 1
            block, self.pending = self.pending[:end], self.pending[end:]
        else:
            block, self.pending = self.pending, b""
        sent: list[bytes] = []
        if block:
            out, broken, self.skip_blank = lines(
                block, self.metered, self.keep_usage_chunk, self.skip_blank
            )
            if out:
                if self.key is not None and self.key in out:
                    out = out.replace(self.key, b"***")
                self.tail = (self.tail + out)[-4:]
                sent.append(out)
            if broken is not None:
                sent.append(self.ending("upstream_error", f"the provider's stream is {broken}"))
                return sent
        if not data:
            sent.extend(self._end())
        elif self.metered.finished and self.tail.replace(b"\r", b"").endswith(b"\n\n"):
            self.done = True  # [DONE] and its blank line went out: nothing more is relayed
        elif len(self.pending) > MAX_LINE:
            sent.append(
                self.ending("upstream_error", f"the provider sent a line over {MAX_LINE} B")
            )
        return sent

    def _end(self) -> list[bytes]:
        self.done = True
        if self.closing.is_set():
            return [self.ending("stream_interrupted", "the gateway is shutting down")]
        if not self.metered.finished and not self.metered.upstream_error:
            return [self.ending("upstream_error", "the provider's stream ended before [DONE]")]
        return []


async def relay(
    response: aiohttp.ClientResponse,
    metered: Metered,
    *,
    keep_usage_chunk: bool,
    key: bytes | None,
    idle: float,
    closing: asyncio.Event,
) -> AsyncIterator[bytes]:
    """The stream of `response`, checked as the module says (`key`: the provider key to mask,
    `idle`: the read timeout it is told in, `closing`: set when the gateway shuts down)."""
    state = _Relay(metered, keep_usage_chunk, key, closing)
    while not state.done:
        try:
            data = await response.content.readany()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            last = state.failed(exc, idle)
            if last:
                yield last
            return
        for out in state.feed(data):
            yield out
