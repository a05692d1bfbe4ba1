"""The first fault after a start: a dead rank's cell returns without waiting for the
survivor's reply, even when the survivor's status file no longer shows its collective.

A survivor's collective fails the moment its dead peer's connection closes; its status
thread may write "nothing in flight" before the kernel has heard of the death. Its status
now also says when a collective of it failed (``failed_at``), and the kernel counts a
failure since the cell was sent as being on its way out (``fail_wait.Seen``). Each test
starts its own cluster and runs the fault in its first cell. The bounds only catch a hang
(they hold with both cores busy); speed is measured in ``benchmarks/fault_paths_bench.py``
(``--first``)."""

from __future__ import annotations

import time

import pytest

from workbench.cluster import Cluster
from workbench.cluster.dispatch import hang
from workbench.cluster.dispatch import rank_dispatch as dispatch
from workbench.errors import EngineDied

pytestmark = [pytest.mark.engines, pytest.mark.slow]

STRETCHED_S = 300.0  # a grace nobody may wait for
BOUND_S = 30.0  # far above a loaded machine's seconds, below the grace and gloo's own 60 s
# rank 1 kills itself while rank 0 waits for it in a barrier
DIES = (
    "import os, signal, time\nif rank == 1:\n    time.sleep(0.3)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
)
# rank 1 cuts its group's connections (rank 0's barrier fails at once, and its status
# loses the barrier), then dies 1.5 s later; rank 0 does not reply after its failure
CUT_THEN_DIES = (
    "import os, signal, time\n"
    "if rank == 1:\n"
    "    from workbench.engine.group_sockets import sever_group_connections\n"
    "    time.sleep(0.3)\n"
    "    sever_group_connections()\n"
    "    time.sleep(1.5)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "try:\n"
    "    dist.barrier()\n"
    "except Exception:\n"
    "    time.sleep(600)\n"
)


def _failed_at(cluster: Cluster, rank: int) -> float:
    """When the status file of ``rank`` says a collective of it last failed (0.0: never),
    waiting up to ``BOUND_S`` for its status thread to write one."""
    give_up = time.monotonic() + BOUND_S
    while True:
        status = hang.read_status(cluster.engines.run_dir, rank) or {}
        failed_at = float(status.get("failed_at") or 0.0)
        if failed_at or time.monotonic() > give_up:
            return failed_at
        time.sleep(0.05)


def test_the_first_cell_after_a_start_names_the_dead_rank_and_its_survivor_failed(
    own_cluster: Cluster,
) -> None:
    sent = time.time()
    start = time.monotonic()
    with pytest.raises(EngineDied, match=r"engine died: rank 1 \(engine") as info:
        own_cluster.execute(DIES, timeout=STRETCHED_S)
    assert time.monotonic() - start < BOUND_S
    assert info.value.ranks == [1]
    assert own_cluster.state == "degraded"
    # the survivor's status says its barrier failed, after the cell was sent
    assert _failed_at(own_cluster, 0) >= sent


def test_a_survivor_whose_collective_already_failed_is_not_waited_for(
    own_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waiting for rank 0's reply (it sleeps after its barrier failed) or for the grace
    # would take far beyond the bound: the cell must return on rank 0's status alone.
    monkeypatch.setattr(dispatch, "_DEATH_GRACE_S", STRETCHED_S)
    sent = time.time()
    start = time.monotonic()
    with pytest.raises(EngineDied, match=r"engine died: rank 1 \(engine") as info:
        own_cluster.execute(CUT_THEN_DIES, timeout=BOUND_S + 10)
    assert time.monotonic() - start < BOUND_S
    assert info.value.ranks == [1]
    assert _failed_at(own_cluster, 0) >= sent
    # rank 0 never replied: it is left to recovery (``_ensure_free`` or recover())
    assert 0 in own_cluster.stuck_ranks
