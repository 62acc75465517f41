"""A hostile provider answers the translator (LiteLLM, a process of its own) with a gzip bomb:
10 MiB on the wire, 10 GiB once inflated. The translator's address space is capped
(ACS_LLM_TRANSLATOR_MEMORY_BYTES, RLIMIT_AS), so it never holds more than the cap: the call
answers a JSON error, and the next call is served (by a new translator if the bomb killed it).

A watchdog reads the translator's resident memory while the bomb is inflated; should it pass
the cap (no limit in force), the watchdog kills the translator at once, so that the host's
memory is never at stake, and the test fails."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controlplane.config import ServiceConfig
from tests.support.hostile_llm import CANARY, Answer, HostileUpstream
from tests.support.live_server import LiveServer, start_live_server
from tests.support.processes import translators

GATEWAY = "/api/v1/llm-gateway/v1"
CAP = 768 << 20
"""The translator's cap in this test: LiteLLM imported and serving fits (~0.5 GiB of address
space), the bomb does not."""
INFLATED = 10 << 30
"""What the bomb inflates to: 10 GiB of zeros."""
BLOCK = 1 << 20


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine: the CRC-32 of A+B from those of A and B and B's length (so that
    the bomb's trailer is right without 10 GiB passing through crc32)."""
    one_bit = [0xEDB88320] + [1 << n for n in range(31)]  # a zero bit, as a GF(2) matrix
    zeros = _gf2_square(_gf2_square(_gf2_square(one_bit)))  # a zero byte
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(zeros, crc1)
        len2 >>= 1
        zeros = _gf2_square(zeros)  # twice as many zero bytes
    return crc1 ^ crc2


def gzip_bomb(inflated: int) -> list[bytes]:
    """A well-formed gzip member of `inflated` zero bytes (a multiple of 1 MiB), in 64 KiB
    pieces: one deflate block of 1 MiB of zeros, flushed so that it stands alone, repeated."""
    assert inflated % BLOCK == 0
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(bytes(BLOCK)) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush(zlib.Z_FINISH)
    crc = crc_of_zeros(inflated)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = crc.to_bytes(4, "little") + (inflated & 0xFFFFFFFF).to_bytes(4, "little")
    body = header + block * (inflated // BLOCK) + end + trailer
    return [body[i : i + 65536] for i in range(0, len(body), 65536)]


def crc_of_zeros(length: int) -> int:
    """The CRC-32 of `length` zero bytes (a multiple of 1 MiB), by doubling."""
    blocks, crc = length // BLOCK, 0
    power, power_length = zlib.crc32(bytes(BLOCK)), BLOCK
    while blocks:
        if blocks & 1:
            crc = crc32_combine(crc, power, power_length)
        blocks >>= 1
        if blocks:
            power = crc32_combine(power, power, power_length)
            power_length *= 2
    return crc


def test_the_bomb_is_a_well_formed_gzip() -> None:
    """Checked small, against zlib itself: what the gateway test sends is a real gzip body."""
    small = b"".join(gzip_bomb(5 * BLOCK))
    assert zlib.decompress(small, 31) == bytes(5 * BLOCK)
    assert len(b"".join(gzip_bomb(INFLATED))) < 11 << 20


def resident(pid: int) -> int:
    """Bytes of `pid` in RAM now (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Watchdog:
    """Samples the translators' resident memory every 10 ms; kills one past the cap."""

    def __init__(self) -> None:
        self.peak = 0
        self.killed: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watchdog:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _watch(self) -> None:
        while True:
            for pid in translators():
                used = resident(pid)
                self.peak = max(self.peak, used)
                if used > CAP:
                    self.killed.append(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)


@pytest.fixture
async def live_and_hostile(
    make_config: Callable[..., ServiceConfig],
) -> AsyncIterator[tuple[LiveServer, HostileUpstream]]:
    """A control plane that calls every model through the translator, and a provider on this
    host that its users may name."""
    hostile = await HostileUpstream().start()
    config = make_config(
        llm_gateway_direct=False,  # every call through LiteLLM
        llm_translator_memory_bytes=CAP,
        sandbox_host_ports=[hostile.port],
        llm_gateway_retries=0,
        llm_gateway_timeout=120,  # the translator's first start imports LiteLLM
    )
    server = await start_live_server(config, with_sandboxes=False)
    yield server, hostile
    await server.close()
    await hostile.close()


async def call(
    http: aiohttp.ClientSession, live: LiveServer, key: str
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        live.url + GATEWAY + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=aiohttp.ClientTimeout(total=300),
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def served(
    http: aiohttp.ClientSession, live: LiveServer, key: str
) -> tuple[int, dict[str, Any]]:
    """`call`, asked again (up to three times) while the translator is still starting: on a
    loaded host LiteLLM's import may take longer than the gateway waits for it."""
    for _ in range(3):
        status, body = await call(http, live, key)
        if body.get("error", {}).get("code") != "translator_unavailable":
            break
    return status, body


async def test_a_gzip_bomb_from_the_provider_stays_within_the_translators_cap(
    live_and_hostile: tuple[LiveServer, HostileUpstream], user_headers: Callable[..., Any]
) -> None:
    live, hostile = live_and_hostile
    headers = await user_headers("mallory")
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(
            live.url + "/api/settings",
            json={"llm_model": "m", "llm_base_url": hostile.base_url, "llm_api_key": "sk-m"},
        ) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(live.url + "/api/keys/llm/byor") as resp:
            key = (await resp.json())["key"]
    bomb = await asyncio.to_thread(gzip_bomb, INFLATED)
    async with aiohttp.ClientSession() as http:
        # The translator started and serving first, so that its import is not the bomb's.
        status, body = await served(http, live, key)
        assert status == 200, body
        assert CANARY in body["choices"][0]["message"]["content"]
        (first,) = translators()

        hostile.answer(Answer(headers={"Content-Encoding": "gzip"}, chunks=bomb))
        async with Watchdog() as watchdog:
            status, body = await call(http, live, key)
        assert watchdog.killed == [], f"the translator passed {CAP} bytes ({watchdog.peak})"
        assert watchdog.peak <= CAP
        # Our JSON error, for a failed upstream: a 502 (the translator's MemoryError, or the
        # translator gone mid-call).
        assert status == 502, body
        assert body["error"]["type"] == "api_error"
        if body["error"]["code"] == "upstream_error":  # an allocation failed, the process lives
            # Python's MemoryError, or zlib's "Unable to allocate output buffer", as LiteLLM
            # passed it on.
            assert "MemoryError" in body["detail"] or "allocate" in body["detail"], body
        else:  # it died of it mid-call
            assert body["error"]["code"] == "upstream_unreachable", body
        assert len(hostile.received) == 2

        # The next call is served, by the same translator or by a new one.
        status, body = await served(http, live, key)
        assert status == 200, body
        assert CANARY in body["choices"][0]["message"]["content"]
        now = translators()
        assert len(now) == 1
        print(f"bomb peak RSS {watchdog.peak >> 20} MiB, translator {first} -> {now[0]}")
