"""The pinned OpenHands clients install and run: the base of every real-client test."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.openhands_clients import OpenHandsVenv

pytestmark = [pytest.mark.slow, pytest.mark.clients]


def test_pinned_clients_are_installed(openhands_venv: OpenHandsVenv) -> None:
    version = subprocess.run(
        [openhands_venv.bin("openhands"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "1.16.0" in version.stdout
    probe = subprocess.run(
        [
            openhands_venv.python,
            "-c",
            "import importlib.metadata as m;"
            "print(*(m.version(p) for p in ('openhands-sdk', 'openhands-workspace')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.split() == ["1.21.0", "1.11.1"]
