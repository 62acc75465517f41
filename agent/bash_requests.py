"""The bodies of ``POST /api/bash/start_bash_command`` and ``execute_bash_command``, read
without pydantic when they are already what the models would make of them.

A sandbox's first command comes through ``execute_bash_command``, and pydantic's import and
model building were about a quarter of a boot's CPU (a burst of cold starts pays that per
sandbox on shared cores: bench/README.md, ``agent_boot.py``). So a body that is a JSON object
of the model's own fields, each already of the model's type and within its bounds, is taken as
it is: the model would return exactly those values. Anything else (a missing or unknown field,
``"30"`` or ``30.0`` or ``true`` for the timeout, a number for the command, ...) goes to the
pydantic model (:mod:`agent.bash_models`), which converts what it converts and answers every
422, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .bodies import read_json_body

FIELDS = frozenset({"command", "cwd", "timeout"})


@dataclass(frozen=True)
class TimeoutRule:
    """A request's ``timeout``: its default and bounds (inclusive), in seconds."""

    default: int
    low: int
    high: int


START = TimeoutRule(default=300, low=1, high=86_400)
EXECUTE = TimeoutRule(default=60, low=1, high=3600)


@dataclass(frozen=True)
class BashRequest:
    """A command to run: what the request's model holds once validated."""

    command: str
    cwd: str | None
    timeout: int


def plain_request(data: Any, rule: TimeoutRule) -> BashRequest | None:
    """``data`` as the model reads it where nothing needs converting or refusing: a JSON object
    of the model's fields only, ``command`` a string, ``cwd`` a string or null, ``timeout`` an
    integer (not a boolean) within ``rule``. None for anything else."""
    if type(data) is not dict or not data.keys() <= FIELDS:
        return None
    command, cwd = data.get("command"), data.get("cwd")
    timeout = data.get("timeout", rule.default)
    if type(command) is not str or (cwd is not None and type(cwd) is not str):
        return None
    if type(timeout) is not int or not rule.low <= timeout <= rule.high:
        return None
    return BashRequest(command=command, cwd=cwd, timeout=timeout)


async def read_bash_request(request: web.Request, rule: TimeoutRule) -> BashRequest:
    """The request's command; a 422 ApiError (pydantic's details) when the body does not fit."""
    data = await read_json_body(request)
    plain = plain_request(data, rule)
    if plain is not None:
        return plain
    # The models only for bodies off the plain path: pydantic is not loaded before that.
    from .bash_models import validated  # noqa: PLC0415

    return validated(data, rule)
