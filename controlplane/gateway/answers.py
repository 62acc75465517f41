"""A provider's answer as far as the gateway trusts it: the provider is whatever the user's
`llm_base_url` names, so its answers are checked before anything is taken from them.

- JSON is strict: `NaN`, `Infinity` and `-Infinity`, which Python's parser accepts, are not
  JSON and refused.
- A chat completion is an object whose `choices` is a list of objects.
- `usage`, when given (null counts as not given), is an object with `prompt_tokens` and
  `completion_tokens`, each a non-negative whole number (an integer, or a float with no
  fraction); a count above MAX_TOKENS is taken as MAX_TOKENS. Anything else (negative, NaN,
  a string, a boolean, a field missing) is a malformed answer, never a count.
- LiteLLM's price of a call (the translator's `X-Acs-Cost`) counts when it is a finite,
  non-negative number, else not at all (the call is then priced as any other).

`Metered` is what the gateway takes from one call's answer for its books.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

MAX_TOKENS = 10_000_000
"""The most tokens of one kind one call is metered for: five times the largest context window
offered today (2M), so no honest answer is ever clamped, while a provider's absurd figure
(2**63, 1e300) cannot overflow a counter or a month's budget arithmetic."""


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
    finished: bool = False
    """A stream's `data: [DONE]` arrived."""
    upstream_error: bool = False
    """A stream carried an `error` event of the provider's (or the translator's)."""
    errors: list[str] = field(default_factory=list)

    def take(self, usage: Any) -> None:
        """The provider's usage, when it gave one. Raises MalformedAnswer (and then counts
        nothing as reported: the call is estimated)."""
        try:
            found = usage_of(usage)
        except MalformedAnswer:
            self.reported = False
            raise
        if found is not None:
            self.prompt_tokens, self.completion_tokens = found
            self.reported = True


class MalformedAnswer(ValueError):
    """The provider's answer is not what it claims to be (the message says how)."""


def _reject_constant(name: str) -> Any:
    raise MalformedAnswer(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""Made once: json.loads with an option builds a decoder per call (~20 us, on every event of
every stream)."""


def strict_json(raw: bytes | str) -> Any:
    """The JSON value of `raw` (UTF-8, as RFC 8259 has it). Raises MalformedAnswer."""
    try:
        return _DECODER.decode(raw.decode() if isinstance(raw, bytes) else raw)
    except MalformedAnswer:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise MalformedAnswer(f"not JSON: {exc}") from None


def count(value: Any, name: str) -> int:
    """A token count as metered. Raises MalformedAnswer."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedAnswer(f"usage.{name} is not a number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise MalformedAnswer(f"usage.{name} is not a whole number")
    if value < 0:
        raise MalformedAnswer(f"usage.{name} is negative")
    return MAX_TOKENS if value > MAX_TOKENS else int(value)


def usage_of(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a `usage` value; None when absent. Raises
    MalformedAnswer."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise MalformedAnswer("usage is not an object")
    if "prompt_tokens" not in usage or "completion_tokens" not in usage:
        raise MalformedAnswer("usage lacks prompt_tokens or completion_tokens")
    return (
        count(usage["prompt_tokens"], "prompt_tokens"),
        count(usage["completion_tokens"], "completion_tokens"),
    )


def completion_of(raw: bytes) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """A non-streamed chat completion and its usage. Raises MalformedAnswer."""
    data = strict_json(raw)
    if not isinstance(data, dict):
        raise MalformedAnswer("not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise MalformedAnswer("choices is not a list of objects")
    return data, usage_of(data.get("usage"))


def cost_of_header(value: str | None) -> float | None:
    """LiteLLM's price of a call (`X-Acs-Cost`), when it is a finite, non-negative number."""
    if value is None:
        return None
    try:
        cost = float(value)
    except ValueError:
        return None
    return cost if math.isfinite(cost) and cost >= 0 else None
