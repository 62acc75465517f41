"""A conversation's secrets: static values, and ``LookupSecret``s fetched when a run starts.

A ``LookupSecret`` is fetched with ``GET url`` and its ``headers`` (the OpenHands app server
uses them for git tokens); the answer's body is the value. Fetched values are exported to the
commands like static ones and masked in every event from then on.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from .failures import describe_error
from .models import SecretSource

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT = 10.0


def static_values(secrets: dict[str, SecretSource]) -> dict[str, str]:
    return {name: s.value for name, s in secrets.items() if s.kind == "StaticSecret" and s.value}


async def _lookup(session: aiohttp.ClientSession, source: SecretSource) -> str:
    assert source.url is not None
    timeout = aiohttp.ClientTimeout(total=LOOKUP_TIMEOUT)
    async with session.get(source.url, headers=source.headers, timeout=timeout) as resp:
        body = await resp.text()
        if resp.status >= 400:
            raise RuntimeError(f"HTTP {resp.status}")
        return body.strip()


async def resolve(
    session: aiohttp.ClientSession, secrets: dict[str, SecretSource]
) -> tuple[dict[str, str], list[str]]:
    """(name -> value for every secret that has one, one message per lookup that failed)."""
    values = static_values(secrets)
    lookups = [(n, s) for n, s in secrets.items() if s.kind == "LookupSecret"]
    results = await asyncio.gather(
        *(_lookup(session, s) for _, s in lookups), return_exceptions=True
    )
    errors: list[str] = []
    for (name, _), result in zip(lookups, results, strict=True):
        if isinstance(result, BaseException):
            errors.append(f"secret {name} could not be looked up: {describe_error(result)}")
        elif result:
            values[name] = result
    return values, errors
