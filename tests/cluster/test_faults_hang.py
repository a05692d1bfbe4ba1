"""A hung collective (its report and recovery) and the notebook's interrupt, on a cluster of
this module's own: recovery tears the process group down, which the shared one must not see."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster
from workbench.errors import CollectiveTimeout

pytestmark = pytest.mark.engines

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


ALONE = """
import torch
if rank == 0:
    dist.all_reduce(torch.ones(8))
"""
TOGETHER = """
t = torch.ones(8)
dist.all_reduce(t)
float(t[0])
"""


def test_rank_that_never_joins_gets_a_hang_report_and_recovery(own_cluster: Cluster) -> None:
    started = time.perf_counter()
    with pytest.raises(CollectiveTimeout) as info:
        own_cluster.execute(ALONE, timeout=TIMEOUT)
    latency = time.perf_counter() - started
    assert latency <= TIMEOUT + 2
    report = info.value.report
    assert report["pending"] == [0] and report["finished"] == [1]
    assert report["never_entered"] == [1]
    waiting = report["waiting"][0]
    assert waiting["op"] == "all_reduce" and waiting["bytes"] == 8 * 4
    assert waiting["source"] == "user" and waiting["group_size"] == 2
    text = str(info.value)
    assert "rank 0: waits in all_reduce (32 bytes" in text
    assert "rank 1: finished the cell, never entered all_reduce" in text
    assert own_cluster.state == "degraded" and own_cluster.stuck_ranks == [0]

    pids = [r.pid for r in own_cluster.ranks]
    recovery = own_cluster.recover_sync()
    assert recovery.freed == [0] and recovery.replaced == {}  # no engine lost
    assert [r.pid for r in own_cluster.ranks] == pids
    assert own_cluster.state == "running"
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]


def test_interrupt_stops_a_running_cell_and_leaves_the_cluster_usable(
    own_cluster: Cluster,
) -> None:
    timer = threading.Timer(1.0, _thread.interrupt_main)  # what the notebook's stop does
    timer.start()
    started = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            own_cluster.execute("import time\nfor _ in range(300):\n    time.sleep(0.1)")
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 1.0 + 3.0  # not the 30 s the cell would take
    assert own_cluster.state == "running" and own_cluster.stuck_ranks == []
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert all(r.ok for r in results)
