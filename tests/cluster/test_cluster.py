"""The shared 2-rank cluster: running functions and cells, errors, status, timeouts."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.cluster.processes import local_state
from workbench.errors import ClusterError, CollectiveTimeout, ConfigError, RankError


def _all_reduce_rank() -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.tolist()


def _whoami() -> tuple[int, int, int, str]:
    import torch
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size(), torch.get_num_threads(), os.environ["RANK"]


def _fail_on_rank1() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("only rank 1 fails")
    return dist.get_rank()


def test_process_group_is_ready(cluster: Cluster) -> None:
    assert cluster.world_size == 2
    assert cluster.backend == "gloo"
    assert cluster.run(_all_reduce_rank) == [[3.0] * 3, [3.0] * 3]
    assert cluster.run(_whoami) == [(0, 2, 1, "0"), (1, 2, 1, "1")]
    assert {r.master_addr for r in cluster.ranks} == {"127.0.0.1"}


def test_run_subset_and_arguments(cluster: Cluster) -> None:
    assert cluster.run(pow, 3, 2, ranks=[1]) == [9]
    assert cluster.run(pow, 2, 5, ranks=0) == [32]


def test_run_failure_names_ranks(cluster: Cluster) -> None:
    with pytest.raises(RankError, match=r"failed on ranks \[1\]") as info:
        cluster.run(_fail_on_rank1)
    assert set(info.value.failures) == {1}
    assert "only rank 1 fails" in str(info.value)


def test_identical_failures_render_once(cluster: Cluster) -> None:
    with pytest.raises(RankError) as info:
        cluster.run(divmod, 1, 0)
    rendered = info.value._render_traceback_()
    assert rendered[0] == "[ranks 0, 1]"
    assert sum("ZeroDivisionError" in line for line in rendered) >= 1
    assert not any(line.startswith("[rank 1]") for line in rendered)


def test_execute_collects_outputs_in_rank_order(cluster: Cluster) -> None:
    results = cluster.execute("print('hello from', rank)\nrank * 10")
    assert [r.rank for r in results] == [0, 1]
    assert [r.stdout for r in results] == ["hello from 0\n", "hello from 1\n"]
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["0", "10"]
    failed = cluster.execute("raise KeyError(rank)", ranks=[1])
    assert [(r.rank, r.ename) for r in failed] == [(1, "KeyError")]


def test_bad_ranks_are_config_errors(cluster: Cluster) -> None:
    with pytest.raises(ConfigError, match=r"ranks=\[7\].*0\.\.1"):
        cluster.run(int, ranks=[7])
    with pytest.raises(ConfigError):
        cluster.execute("1", ranks=[])


@pytest.mark.parametrize(
    ("ranks", "why"),
    [
        (lambda: range(10**12), "rank 2 is outside this cluster"),
        (lambda: range(10**40), "rank 2 is outside this cluster"),  # len() of it overflows
        (itertools.count, "rank 2 is outside this cluster"),
        (lambda: itertools.repeat(0), "it lists more than 128 ranks, with repeats"),
        (lambda: ["0"], "'0' is not a rank number"),
        (lambda: 1.0, "not a rank or a list of ranks"),
    ],
    ids=["range-1e12", "range-1e40", "count", "repeat", "str", "float"],
)
def test_a_huge_or_endless_rank_list_is_refused_without_being_built(
    cluster: Cluster, ranks: Callable[[], Any], why: str
) -> None:
    # (the list used to be built before it was checked: a bare MemoryError, or a hang)
    def execute(r: Any) -> Any:
        return cluster.execute("1", ranks=r)

    def run(r: Any) -> Any:
        return cluster.run(int, ranks=r)

    for call in (execute, run):
        with pytest.raises(ConfigError) as info:
            call(ranks())  # a fresh iterable each time
        message = str(info.value)
        assert message.startswith("ranks=") and why in message and "choose from 0..1" in message
        assert len(message) < 200
    assert cluster.execute("rank", ranks=range(1, 2))[0].execute_result["data"] == {
        "text/plain": "1"
    }


def test_timeout_reports_pending_ranks(cluster: Cluster) -> None:
    with pytest.raises(CollectiveTimeout, match=r"ranks \[1\]") as info:
        # without the timeout's interrupt, rank 1 would sleep for two minutes
        cluster.execute("import time\nif rank == 1: time.sleep(120)", timeout=0.3)
    assert info.value.report == {"pending": [1], "finished": [0]}
    assert "ranks [1] were interrupted" in str(info.value)
    # the cluster stays usable: the slow rank was interrupted (generous bound, no hang)
    assert cluster.run(_all_reduce_rank, timeout=60) == [[3.0] * 3, [3.0] * 3]


def test_status_and_repr(cluster: Cluster) -> None:
    rows = cluster.status()
    assert [r["rank"] for r in rows] == [0, 1]
    assert {r["state"] for r in rows} <= {"idle", "busy"}
    assert {r["backend"] for r in rows} == {"gloo"}
    assert all(isinstance(r["pid"], int) and r["pid"] > 0 for r in rows)
    text = repr(cluster)
    assert "state='running'" in text and "world_size=2" in text and "gloo" in text
    assert Cluster.current() is cluster


def test_not_running_is_a_clear_error() -> None:
    idle = Cluster(n=2)
    assert "state='stopped'" in repr(idle)
    with pytest.raises(ClusterError, match="not running"):
        idle.run(int)


def test_bad_settings_name_choices() -> None:
    with pytest.raises(ConfigError, match="'tcp'.*'gloo'"):
        Cluster(n=2, backend="tcp")
    with pytest.raises(ConfigError, match="'k8s'.*'slurm'"):
        Cluster(n=2, launcher="k8s")
    with pytest.raises(ConfigError, match="n=0"):
        Cluster(n=0)


def test_a_quick_cell_reads_each_engines_process_state_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped (frozen) engine is found from its process state; that psutil read is off
    the path of a cell that gets its replies: once per rank before sending, not per poll."""
    from workbench.cluster.dispatch import rank_dispatch as dispatch

    reads: list[int] = []

    def counted(host: str, pid: int) -> str | None:
        reads.append(pid)
        return local_state(host, pid)

    monkeypatch.setattr(dispatch, "local_state", counted)
    # (the health cadence must not fall inside this cell however loaded the machine is)
    monkeypatch.setattr(dispatch, "_HEALTH_S", 600.0)
    results = cluster.execute("x = 1")
    assert [r.ename for r in results] == [None, None]
    assert sorted(reads) == sorted(r.pid for r in cluster.ranks)
