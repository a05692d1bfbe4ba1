"""A spare host under Slurm, on the bed grown to 3 Slurm nodes (wbmn3 is configured in the
partition and DOWN until ``add_node`` starts its slurmd): ``wb.Cluster(n=4,
launcher="slurm", hosts=["wbmn1", "wbmn2"], spare_hosts=...)``, a data-parallel run with
checkpoints, and rank 0's host (the rendezvous) taken down whole mid-step, slurmd included.
The step raises ``HostLost`` naming it and its two ranks; ``session.recover()`` submits
their engines as new 1-engine jobs: pinned to the spare (``spare_hosts=["wbmn3"]``) or
wherever the partition has room but the cluster's own and lost nodes (``spare_hosts="any"``,
``--exclude``; Slurm can only pick wbmn3). LOCAL_RANK / GROUP_RANK / MASTER_ADDR are
recomputed, the run rolls back to its last checkpoint, the loss curve and samples equal the
uninterrupted run's, and after stop nothing is left on any node nor in Slurm's queue. The
same with the host left up (sshd answering) but its slurmd and engines killed and its node
DOWN: Slurm's node state makes it a lost host (``cluster/slurm_nodes.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.multinode import test_spare_host as ssh_spare
from tests.multinode.bed import Bed
from tests.multinode.checks import nothing_left, ok
from tests.multinode.test_spare_host import Report, lost_onto_spare

pytestmark = [pytest.mark.engines, pytest.mark.slow]

QUEUE_EMPTY_S = 180.0  # a job on the lost node is "completing" until Slurm calls it DOWN


@pytest.fixture(
    scope="module",
    params=[("wbmn3", "whole"), ("any", "whole"), ("wbmn3", "slurmd")],
    ids=["spare-wbmn3", "spare-any", "slurmd-down-sshd-up"],
)
def run(request: pytest.FixtureRequest, bed: Bed) -> Iterator[Report]:
    """``whole``: the host goes down whole (link cut, every process killed); ``slurmd``:
    its sshd still answers, but its slurmd and engines are killed and Slurm has it DOWN
    (the node-state signal: without it, a dead process to replace on that node)."""
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    spare, how = request.param
    take_down = bed.fail_slurmd if how == "slurmd" else None
    with lost_onto_spare(bed, "slurm", spare, take_down) as report:
        report["queue"] = _queue_after_stop(bed)
        yield report


def _queue_after_stop(bed: Bed) -> str:
    """squeue once it is empty (or what it still lists after ``QUEUE_EMPTY_S``)."""
    deadline = time.monotonic() + QUEUE_EMPTY_S
    while queue := bed.run_user(["squeue", "-h", "-o", "%i %t %N %j"], timeout=30).stdout:
        if time.monotonic() > deadline:
            return queue
        time.sleep(1)
    return ""


def test_rank_0s_node_lost_is_host_lost_naming_it(run: Report) -> None:
    ssh_spare.test_rank_0s_host_lost_is_host_lost_naming_it(run)


def test_its_ranks_start_on_the_spare_node_as_new_jobs(run: Report) -> None:
    ssh_spare.test_its_ranks_start_on_the_spare_with_a_new_rendezvous(run)


def test_the_resumed_curve_equals_the_uninterrupted_run(run: Report) -> None:
    ssh_spare.test_the_resumed_curve_equals_the_uninterrupted_run(run)


def test_nothing_is_left_on_any_node_nor_in_the_queue_after_stop(bed: Bed, run: Report) -> None:
    nothing_left(bed, ok(run))
    assert run["queue"] == "", run["queue"]
