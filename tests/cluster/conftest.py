"""Fixtures of the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster


def _started(n: int) -> Iterator[Cluster]:
    cluster = Cluster(n=n, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A 2-rank cluster of the test's own (never the shared session one), always stopped:
    for tests that kill, freeze or block its engines."""
    yield from _started(2)


@pytest.fixture
def own_four_ranks() -> Iterator[Cluster]:
    """The same with 4 ranks: a death that leaves several survivors."""
    yield from _started(4)
