"""The pydantic models of the bash routes' bodies, for those :mod:`agent.bash_requests` does
not take as they are (conversions and the 422s)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .bash_requests import EXECUTE, START, BashRequest, TimeoutRule
from .validation import validate_body


class StartBashRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str
    cwd: str | None = None
    timeout: int = Field(default=START.default, ge=START.low, le=START.high)


class ExecuteBashRequest(StartBashRequest):
    timeout: int = Field(default=EXECUTE.default, ge=EXECUTE.low, le=EXECUTE.high)


MODELS: dict[TimeoutRule, type[StartBashRequest]] = {
    START: StartBashRequest,
    EXECUTE: ExecuteBashRequest,
}


def validated(data: Any, rule: TimeoutRule) -> BashRequest:
    """``data`` checked by the model of ``rule``'s route; a 422 ApiError when it does not fit."""
    body = validate_body(data, MODELS[rule])
    return BashRequest(command=body.command, cwd=body.cwd, timeout=body.timeout)
