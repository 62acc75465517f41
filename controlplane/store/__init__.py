"""Redis access. Only this package and the per-domain store modules know key names."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A Redis reply as str, whatever the client's decode setting."""
    return value.decode() if isinstance(value, bytes) else str(value)
