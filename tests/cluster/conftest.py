"""Fixtures of the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A 2-rank cluster of the test's own (never the shared session one), always stopped:
    for tests that kill, freeze or block its engines."""
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()
