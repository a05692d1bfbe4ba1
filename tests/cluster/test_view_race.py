"""An engine that leaves the controller between the liveness check and the request (a kill
just before a step, seen under load) is ``EngineDied`` naming its rank, never
ipyparallel's ``IndexError: No such engine``."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.state import ClusterState
from workbench.cluster.world import World
from workbench.errors import EngineDied


class _Client:
    """Lists engine 1 (the check saw it) but no longer has it (the request does not)."""

    ids = (0, 1)

    def __getitem__(self, engine_id: int) -> Any:
        if engine_id == 1:
            raise IndexError(f"No such engine: {engine_id}")
        return object()


def _rank(rank: int) -> RankAssignment:
    return RankAssignment(
        rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0,
        num_nodes=1, engine_id=rank, host="elsewhere", pid=999_999, device="cpu",
        backend="gloo", master_addr="127.0.0.1", master_port=1, threads=1,
    )  # fmt: skip


def test_engine_gone_between_check_and_request_is_engine_died() -> None:
    cluster = Cluster(n=2)
    cluster.engines._client = _Client()
    cluster._set_world(World(tuple([_rank(0), _rank(1)])))
    cluster._set_state(ClusterState.RUNNING)
    try:
        cluster.view(0)  # a live engine: its view
        with pytest.raises(EngineDied) as info:
            cluster.view(1)
        assert info.value.ranks == [1]
        assert "rank 1" in str(info.value) and "No such engine" not in str(info.value)
        assert cluster.state == "degraded"
    finally:
        cluster.engines._client = None
        cluster._set_world(World())
        cluster._set_state(ClusterState.STOPPED)
