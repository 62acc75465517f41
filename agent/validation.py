"""JSON request bodies checked against pydantic models: their errors as the 422 ``detail``
list of :mod:`agent.errors`."""

from __future__ import annotations

from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from .bodies import read_json_body
from .errors import ApiError

ModelT = TypeVar("ModelT", bound=BaseModel)


def validation_detail(exc: ValidationError, prefix: str = "body") -> list[dict[str, Any]]:
    """Turn a pydantic error into the ``detail`` list of a 422 response."""
    return [
        {
            "loc": [prefix, *(str(part) for part in err["loc"])],
            "msg": err["msg"],
            "type": err["type"],
        }
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def validate_body(data: Any, model: type[ModelT]) -> ModelT:
    """``data`` checked against ``model``; a 422 ApiError listing what does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, validation_detail(exc)) from exc


async def parse_json_body(request: web.Request, model: type[ModelT]) -> ModelT:
    """Parse and validate a JSON request body, raising a 422 ApiError on failure."""
    return validate_body(await read_json_body(request), model)
