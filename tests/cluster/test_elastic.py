"""Shrinking and growing the rank table, and telling a lost host from a dead process, with
no engines: the decisions ``recover(shrink=True)`` and ``grow`` act on."""

from __future__ import annotations

import pytest

from tests.cluster.rank_tables import ranks_on
from workbench.cluster.lifecycle.elastic import decide_loss, grown_ranks, probe_host, shrunk_ranks
from workbench.errors import HostLost


def test_a_dead_engine_on_a_reachable_host_is_a_dead_process() -> None:
    ranks = ranks_on([("a", 2), ("b", 2)])
    asked: list[str] = []

    def probe(host: str) -> bool:
        asked.append(host)
        return True

    decide_loss(ranks, [2, 3], probe)  # host b answers: the per-engine path, no error
    assert asked == ["b"]
    decide_loss(ranks, [3], lambda host: False)  # b still has a live engine: not lost


def test_a_silent_host_with_every_engine_gone_is_host_lost() -> None:
    ranks = ranks_on([("a", 2), ("b", 2)])
    with pytest.raises(HostLost) as info:
        decide_loss(ranks, [2, 3], lambda host: host != "b")
    assert info.value.host == "b" and info.value.ranks == [2, 3]
    assert "'b'" in str(info.value) and "shrink=True" in str(info.value)


def test_this_host_always_answers_the_probe() -> None:
    import socket

    assert probe_host(socket.gethostname())


def test_shrink_renumbers_the_survivors_contiguously_and_relocalizes() -> None:
    ranks = ranks_on([("a", 2), ("b", 2)])
    left = shrunk_ranks(ranks, [1, 2])
    assert [(r.rank, r.engine_id) for r in left] == [(0, 0), (1, 3)]
    assert {r.world_size for r in left} == {2}
    assert [(r.host, r.local_rank, r.local_world_size, r.node_rank) for r in left] == [
        ("a", 0, 1, 0),
        ("b", 0, 1, 1),
    ]


def test_losing_rank_0_makes_the_next_survivor_rank_0() -> None:
    left = shrunk_ranks(ranks_on([("a", 3)]), [0])
    assert [(r.rank, r.engine_id, r.local_rank) for r in left] == [(0, 1, 0), (1, 2, 1)]


def test_grow_appends_new_ranks_after_the_survivors() -> None:
    ranks = shrunk_ranks(ranks_on([("a", 3)]), [2])
    new = ranks_on([("a", 1)])[0]
    grown = grown_ranks(ranks, [new.__class__(**{**new.as_dict(), "engine_id": 9})])
    assert [(r.rank, r.engine_id, r.local_rank, r.world_size) for r in grown] == [
        (0, 0, 0, 3),
        (1, 1, 1, 3),
        (2, 9, 2, 3),
    ]
