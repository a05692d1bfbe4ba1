from __future__ import annotations

import pytest

from workbench.cluster.ranks import EngineInfo, assign_ranks
from workbench.errors import ClusterError, ConfigError


def _engines(layout: list[tuple[str, int]], *, gpus: int = 0, cpus: int = 8) -> list[EngineInfo]:
    """layout: (host, engine count) in launch order; engine ids interleave across hosts."""
    engines = []
    eid = 0
    pending = [[host, n] for host, n in layout]
    while any(n for _, n in pending):
        for item in pending:
            if item[1]:
                host = str(item[0])
                engines.append(
                    EngineInfo(
                        engine_id=eid,
                        host=host,
                        pid=1000 + eid,
                        address=f"10.0.0.{len(host)}",
                        cuda_devices=gpus,
                        cpus=cpus,
                    )
                )
                eid += 1
                item[1] -= 1
    return engines


def test_single_host_uses_loopback_and_gloo() -> None:
    ranks = assign_ranks(_engines([("box", 2)], cpus=2))
    assert [r.rank for r in ranks] == [0, 1]
    assert {r.master_addr for r in ranks} == {"127.0.0.1"}
    assert {r.backend for r in ranks} == {"gloo"}
    assert {r.device for r in ranks} == {"cpu"}
    assert [r.local_rank for r in ranks] == [0, 1]
    assert {r.threads for r in ranks} == {1}  # 2 cores shared by 2 engines


def test_two_hosts_four_engines_each_grouped_by_host() -> None:
    engines = _engines([("nodeA", 4), ("nodeBB", 4)], gpus=4)
    ranks = assign_ranks(engines)
    assert [r.host for r in ranks] == ["nodeA"] * 4 + ["nodeBB"] * 4
    assert [r.local_rank for r in ranks] == [0, 1, 2, 3] * 2
    assert [r.node_rank for r in ranks] == [0] * 4 + [1] * 4
    assert {r.world_size for r in ranks} == {8}
    assert {r.num_nodes for r in ranks} == {2}
    # rank 0's host address is the rendezvous for everyone
    assert {r.master_addr for r in ranks} == {engines[0].address}
    assert {r.backend for r in ranks} == {"nccl"}
    assert [r.device for r in ranks] == [f"cuda:{i}" for i in range(4)] * 2
    # engine ids within a host stay in increasing order
    for host in ("nodeA", "nodeBB"):
        ids = [r.engine_id for r in ranks if r.host == host]
        assert ids == sorted(ids)


def test_uneven_hosts() -> None:
    ranks = assign_ranks(_engines([("a", 3), ("bb", 1)], cpus=6))
    assert [(r.host, r.local_rank, r.local_world_size) for r in ranks] == [
        ("a", 0, 3),
        ("a", 1, 3),
        ("a", 2, 3),
        ("bb", 0, 1),
    ]
    assert [r.threads for r in ranks] == [2, 2, 2, 6]


def test_env_is_torchrun_compatible() -> None:
    r = assign_ranks(_engines([("h", 2)]), master_port=31337)[1]
    env = r.env()
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_PORT"] == "31337" and env["MASTER_ADDR"] == "127.0.0.1"


def test_auto_backend_falls_back_to_gloo_when_gpus_are_short() -> None:
    ranks = assign_ranks(_engines([("h", 4)], gpus=2))
    assert {r.backend for r in ranks} == {"gloo"}


def test_nccl_without_enough_gpus_is_a_clear_error() -> None:
    with pytest.raises(ClusterError, match="one CUDA device per engine"):
        assign_ranks(_engines([("h", 2)], gpus=1), backend="nccl")


def test_unknown_backend_names_choices() -> None:
    with pytest.raises(ConfigError, match="'mpi'.*gloo"):
        assign_ranks(_engines([("h", 1)]), backend="mpi")


def test_threads_override() -> None:
    ranks = assign_ranks(_engines([("h", 2)], cpus=16), threads_per_engine=3)
    assert {r.threads for r in ranks} == {3}


def test_no_engines_and_duplicates_are_errors() -> None:
    with pytest.raises(ClusterError, match="no engines"):
        assign_ranks([])
    e = EngineInfo(engine_id=0, host="h", pid=1)
    with pytest.raises(ClusterError, match="duplicate"):
        assign_ranks([e, e])
