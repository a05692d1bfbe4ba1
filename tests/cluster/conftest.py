"""Fixtures of the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import restore_health
from workbench.cluster import Cluster


def _started(n: int) -> Iterator[Cluster]:
    cluster = Cluster(n=n, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


@pytest.fixture(scope="module")
def _module_cluster() -> Iterator[Cluster]:
    yield from _started(2)


@pytest.fixture
def own_cluster(_module_cluster: Cluster) -> Cluster:
    """A 2-rank cluster of the module's own (never the shared session one), always stopped
    at the module's end: for tests that kill, freeze or block its engines. One start per
    module: each test gets it healthy again (recovered, or restarted) after the test
    before it broke it."""
    restore_health(_module_cluster)
    return _module_cluster


@pytest.fixture
def own_four_ranks() -> Iterator[Cluster]:
    """The same with 4 ranks: a death that leaves several survivors."""
    yield from _started(4)
