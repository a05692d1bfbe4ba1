"""``Cluster.run_each``: each rank its own arguments, results by rank, on real engines.

A failing rank with ``fail_together`` ends the call soon after the failure (its peer, left
waiting in a collective, is marked stuck for ``recover()``) instead of at the timeout; a
timeout raises ``CollectiveTimeout`` with the hang report. Tests that leave a rank blocked
use a cluster of their own.
"""

from __future__ import annotations

import pytest

from workbench import validate
from workbench.cluster import Cluster
from workbench.errors import CollectiveTimeout, ConfigError, RankError

pytestmark = pytest.mark.engines

# Far beyond the failed-peer grace (fail_wait.PEER_GRACE_S): a call that raises RankError
# before this ran out did not wait for the rank blocked in the collective.
LONG_S = 300.0


def _tagged(tag: str, n: int) -> tuple[str, int, int]:
    import torch.distributed as dist

    return tag, n * 10, dist.get_rank()


def _fail_or_wait(fail: bool) -> str:
    """Rank told to fail raises; the other waits for it in a collective (a gloo barrier
    cannot be interrupted: only ``recover()`` frees it)."""
    import torch.distributed as dist

    if fail:
        raise ValueError("this rank failed on purpose")
    dist.barrier()
    return "passed the barrier"


def _sleep(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def test_each_rank_gets_its_own_arguments(cluster: Cluster) -> None:
    assert cluster.run_each(_tagged, {0: ("a", 1), 1: ("b", 2)}) == {
        0: ("a", 10, 0),
        1: ("b", 20, 1),
    }
    # a subset of the ranks, through the dispatcher the cluster holds
    assert cluster.dispatch.run_each(_tagged, {1: ["only", 7]}) == {1: ("only", 70, 1)}


def test_bad_per_rank_arguments_are_refused_before_any_work(cluster: Cluster) -> None:
    with pytest.raises(ConfigError, match=r"args_by_rank=.*not a dict of ranks"):
        cluster.run_each(_tagged, [("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ranks=.*choose from 0\.\.1"):
        cluster.run_each(_tagged, {5: ("a", 1)})
    with pytest.raises(ConfigError, match=r"rank 0's arguments are not a tuple"):
        cluster.run_each(_tagged, {0: "a"})  # type: ignore[dict-item]
    assert cluster.stuck_ranks == []


def test_per_rank_arguments_are_checked_like_every_input() -> None:
    assert validate.args_by_rank({1: ["x"], 0: ()}, 2) == {1: ("x",), 0: ()}
    with pytest.raises(ConfigError, match=r"not a dict of ranks"):
        validate.args_by_rank({}, 2)


def test_a_failing_rank_ends_the_call_and_its_waiting_peer_is_stuck(own_cluster: Cluster) -> None:
    with pytest.raises(RankError) as raised:
        own_cluster.run_each(_fail_or_wait, {0: (True,), 1: (False,)}, timeout=LONG_S)
    failures = raised.value.failures or {}
    assert "this rank failed on purpose" in failures[0]
    assert "rank 1 still waits (in a collective) for rank(s) [0]" in failures[1]
    assert own_cluster.stuck_ranks == [1]
    assert own_cluster.state == "degraded"
    own_cluster.recover_sync()  # frees rank 1 (its engine kept) and re-creates the group
    assert own_cluster.stuck_ranks == []
    assert own_cluster.run_each(_tagged, {0: ("x", 1), 1: ("y", 2)}) == {
        0: ("x", 10, 0),
        1: ("y", 20, 1),
    }


def test_without_fail_together_the_call_waits_for_its_timeout(own_cluster: Cluster) -> None:
    with pytest.raises(CollectiveTimeout) as raised:
        own_cluster.run_each(
            _fail_or_wait, {0: (True,), 1: (False,)}, timeout=8, fail_together=False
        )
    assert raised.value.report  # the hang report says where rank 1 was
    assert own_cluster.stuck_ranks == [1]  # still in the barrier
    own_cluster.recover_sync()
    assert own_cluster.run_each(_tagged, {1: ("z", 3)}) == {1: ("z", 30, 1)}


def test_a_timeout_raises_the_hang_report_and_frees_a_rank_in_python_code(
    cluster: Cluster,
) -> None:
    with pytest.raises(CollectiveTimeout):
        cluster.run_each(_sleep, {0: (LONG_S,), 1: (0.0,)}, timeout=2)
    # rank 0 was in Python code (a sleep): the interrupt ended it, nothing is left blocked
    assert cluster.stuck_ranks == []
    assert cluster.run_each(_sleep, {0: (0.0,), 1: (0.0,)}) == {0: 0.0, 1: 0.0}
