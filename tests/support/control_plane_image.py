"""The control plane's own image (Dockerfile), built once per test session by the script behind
`make image` (docker's layer cache makes that a second or two when nothing changed): both the
image's own tests (tests/app/test_control_plane_image.py) and the deployed control plane on the
Kubernetes test cluster (tests/drivers/kubernetes/test_deployed_control_plane.py) run it."""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

from tests.support.sandbox_helpers import IMAGE_TAG, REPO

IMAGE = f"acs-control-plane:{IMAGE_TAG}"


@functools.cache
def control_plane_image() -> str:
    """The image, (re)built from the working tree by the host's engine; its name."""
    env = {k: v for k, v in os.environ.items() if k != "ACS_IMAGE"} | {"ACS_IMAGE": IMAGE}
    result = subprocess.run(
        [str(REPO / "scripts" / "build-control-plane-image.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"image build failed:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return IMAGE
