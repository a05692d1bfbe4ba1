"""The cluster's state is an enum with allowed moves (state.py): a move the lifecycle does not
allow is one clear error naming both states and the allowed ones; the values stay the strings
users saw (printed outputs and kept clusters read the same)."""

from __future__ import annotations

import pytest

from workbench.cluster import Cluster
from workbench.cluster.state import ALLOWED, ClusterState, checked_move
from workbench.errors import ClusterError


def test_a_move_not_allowed_names_from_to_and_the_allowed_ones() -> None:
    with pytest.raises(ClusterError) as info:
        checked_move(ClusterState.BROKEN, ClusterState.RUNNING)
    message = str(info.value)
    assert "'broken' to 'running'" in message
    assert "stopped, stopping" in message


def test_an_unknown_state_names_the_states() -> None:
    with pytest.raises(ClusterError, match="unknown cluster state 'runing'.*running"):
        checked_move(ClusterState.STOPPED, "runing")


def test_every_state_can_reach_stopped_and_the_values_are_the_old_strings() -> None:
    for state, targets in ALLOWED.items():
        assert ClusterState.STOPPED in targets or ClusterState.STOPPING in targets, state
    assert ClusterState.RUNNING == "running" and f"{ClusterState.DEGRADED}" == "degraded"
    assert repr(ClusterState.BROKEN) == "'broken'" and str(ClusterState.BROKEN) == "broken"


def test_the_cluster_refuses_a_move_and_keeps_its_state() -> None:
    cluster = Cluster(n=1)
    assert cluster.state == "stopped" and "state='stopped'" in repr(cluster)
    with pytest.raises(ClusterError, match="from 'stopped' to 'stopped'"):
        cluster._set_state(ClusterState.STOPPED)
    cluster._set_state(ClusterState.STARTING)
    with pytest.raises(ClusterError, match="from 'starting' to 'degraded'"):
        cluster._set_state(ClusterState.DEGRADED)
    assert cluster.state == ClusterState.STARTING
    cluster._set_state(ClusterState.STOPPED)


def test_a_death_reported_while_the_cluster_stops_changes_nothing() -> None:
    cluster = Cluster(n=1)
    for state in (ClusterState.STARTING, ClusterState.RUNNING):
        cluster._set_state(state)
    cluster._degrade()  # the dispatch saw an engine die
    assert cluster.state == "degraded"
    cluster._set_state(ClusterState.STOPPING)
    cluster._degrade()  # ... and another while the stop runs (another thread): moot
    assert cluster.state == ClusterState.STOPPING
    cluster._set_state(ClusterState.STOPPED)
