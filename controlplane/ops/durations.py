"""Durations on the command line: `90s`, `30m`, `2h`, `1d`, and combinations such as `1h30m`."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
MAX_DURATION = timedelta(days=3650)


def parse_duration(text: str) -> timedelta:
    """`1h30m` -> 1:30:00. Raises ValueError naming what is accepted."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if not value or match is None or not any(match.groups()):
        raise ValueError(
            f"invalid duration {text!r}: use a number with a unit d, h, m or s, "
            "largest first, e.g. 90s, 30m, 2h, 1d, 1h30m"
        )
    seconds = sum(
        int(amount) * _UNITS[unit]
        for amount, unit in zip(match.groups(), _UNITS, strict=True)
        if amount
    )
    if seconds == 0:
        raise ValueError(f"invalid duration {text!r}: must be longer than 0s")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"invalid duration {text!r}: longer than 3650d")
    return timedelta(seconds=seconds)


def duration_arg(text: str) -> timedelta:
    """argparse `type=`: a bad duration becomes a usage error (exit 2)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_duration(delta: timedelta) -> str:
    """The largest unit and the next one when not zero, for humans: 1d2h, 2h, 35m5s, 12s."""
    seconds = max(0, int(delta.total_seconds()))
    sizes = list(_UNITS.items())
    for index, (unit, size) in enumerate(sizes):
        amount, rest = divmod(seconds, size)
        if amount or unit == "s":
            text = f"{amount}{unit}"
            if index + 1 < len(sizes):
                smaller, smaller_size = sizes[index + 1]
                if rest // smaller_size:
                    text += f"{rest // smaller_size}{smaller}"
            return text
    return "0s"  # pragma: no cover - the loop always returns at "s"
