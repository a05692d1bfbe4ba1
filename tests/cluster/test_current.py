"""One answer to "which cluster is current": ``Cluster.latest()``, read by
``Cluster.current()``, ``%wb``/``%%wb``, the stepper and the dashboard alike. Clusters are
stacked in the order they started; stopping the current one makes the one before current."""

from __future__ import annotations

import weakref
from unittest import mock

import pytest

from workbench.cluster import Cluster
from workbench.cluster.state import ClusterState
from workbench.errors import ClusterError


def _as_started(*clusters: Cluster) -> list[weakref.ref[Cluster]]:
    for c in clusters:
        c._set_state(ClusterState.RUNNING)
    return [weakref.ref(c) for c in clusters]


def test_the_last_started_cluster_not_stopped_is_current() -> None:
    first, second = Cluster(n=1), Cluster(n=1)
    with mock.patch("workbench.cluster.cluster._current", _as_started(first, second)):
        assert Cluster.latest() is second and Cluster.current() is second
        second._set_state(ClusterState.STOPPED)  # %wb stop on the current one
        assert Cluster.latest() is first and Cluster.current() is first
        first._set_state(ClusterState.BROKEN)  # a dead controller is still the current cluster...
        assert Cluster.latest() is first
        with pytest.raises(ClusterError, match="controller"):  # ...that says what happened
            Cluster.current()
        first._set_state(ClusterState.STOPPED)
        assert Cluster.latest() is None
        with pytest.raises(ClusterError, match="no running cluster"):
            Cluster.current()
    assert (first.state, second.state) == ("stopped", "stopped")
