"""Replace secret values with ``<secret-hidden>`` in every string of an event."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MASK = "<secret-hidden>"


class Masker:
    """Masks a fixed set of secret values; longest first, so overlapping secrets stay hidden."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._values: set[str] = set()
        self._secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Mask these values too from now on (secrets updated or looked up later)."""
        for secret in secrets:
            if not secret:
                continue
            self._values.add(secret)
            stripped = secret.strip()  # a value pasted with a trailing newline
            if stripped:
                self._values.add(stripped)
        self._secrets = sorted(self._values, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def mask(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys too) masked."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.mask(k): self.mask(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.mask(v) for v in value]
        return value
