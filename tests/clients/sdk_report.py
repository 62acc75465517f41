"""What the scripts run in the OpenHands clients' venvs (tests/clients/sdk_*.py) print: one JSON
report on their last line, which the test reads (tests/support/openhands_clients.py,
run_client_script). Imported by those scripts from their own folder (the script's directory is
the first entry of sys.path)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def report(main: Callable[[], dict[str, Any]]) -> None:
    """Prints main()'s report; an exception is a report too, with its reason for the test to
    show, and exit status 1."""
    try:
        print(json.dumps(main()))
    except Exception as exc:  # the test shows the reason
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
