"""The high-availability tests' Redis Sentinel cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sentinel_cluster import SentinelCluster


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A master, its replicas and their sentinels (tests/support/sentinel_cluster.py), of this
    test alone."""
    started = SentinelCluster(tmp_path / "redis")
    started.start()
    yield started
    started.stop()
